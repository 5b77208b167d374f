"""Every label, annotation and environment name trainhook reads or writes, in one leaf module.

This module imports nothing from trainhook, so the webhook, the launcher, the local runner and the CLI can all
share the keys without importing each other (the mistake jobset's webhook makes for one constant).
Each constant says who sets it and who reads it. The user-facing meaning is in docs/use/contract.md.
"""

from __future__ import annotations

PREFIX = "trainhook.dev/"

# --- Labels and annotations a user writes (contract section 2) ---------------------------------------------
# Label on the workload and its pod template (or a bare Pod): opts the object in. Read by the webhook, which
# ignores every object without it; the chart's objectSelector matches the same key.
FRAMEWORK = PREFIX + "framework"
# Label, on a workload or its pod template (or both, agreeing): the gang's name. Defaulted (and stamped on the
# template) by the webhook to the workload's name.
JOB_NAME = PREFIX + "job-name"
# Label, on a workload or its pod template (or both, agreeing): the replica role. Defaulted (and stamped on the
# template) by the webhook to the framework's main role.
ROLE = PREFIX + "role"
# Label on bare Pods: the pod's index within its role (StatefulSet/Job pods take their ordinal instead).
INDEX = PREFIX + "index"
# Annotation `role=count[,role=count]`: the gang's shape. Stamped on templates by the webhook for single-role
# workloads; written by users for multi-role gangs and bare Pods.
REPLICAS = PREFIX + "replicas"
# Annotation the webhook writes on a controller-made gang pod: which controller made it, under the gang key
# (webhook/admission/provenance.py); the notary trusts a pod's controller only through it.
PROVENANCE = PREFIX + "provenance"
# Annotation: the master/coordinator port (defaults per framework below).
PORT = PREFIX + "port"
# Annotation: processes per node for torchrun: auto, cpu, gpu or an integer.
NPROC_PER_NODE = PREFIX + "nproc-per-node"
# Annotation: PyTorch elastic `min:max` nodes.
ELASTIC = PREFIX + "elastic"
# Annotation: PyTorch elastic restarts allowed inside torchrun (PET_MAX_RESTARTS).
MAX_RESTARTS = PREFIX + "max-restarts"
# Annotation: the training container's name (default: the first container).
CONTAINER = PREFIX + "container"
# Annotation: what the injected init container waits for: dns, tcp or none.
GANG_WAIT = PREFIX + "gang-wait"

# Annotation: the gang scheduler the pods are handed to: kueue, volcano or coscheduling.
GANG_SCHEDULER = PREFIX + "gang-scheduler"
# Annotation: the scheduler's queue (Kueue LocalQueue, Volcano queue).
QUEUE = PREFIX + "queue"
# Annotation: how many pods must be placeable together (Kubeflow's schedulingPolicy.minAvailable).
MIN_AVAILABLE = PREFIX + "min-available"
# Annotation: the pods' PriorityClass (Kubeflow's schedulingPolicy.priorityClass).
PRIORITY_CLASS = PREFIX + "priority-class"
# Annotation: the coscheduling plugin's scheduler name (its deployments name their profile).
SCHEDULER_NAME = PREFIX + "scheduler-name"

# Annotation: what the gang does when a member's training fails: fail-gang (default) or restart-gang (up to
# MAX_RESTARTS times, for the failures FAILURE_RULES retries). Read by the launcher through TH_ON_FAILURE.
ON_FAILURE = PREFIX + "on-failure"
FAIL_GANG, RESTART_GANG = "fail-gang", "restart-gang"
ON_FAILURE_VALUES = (FAIL_GANG, RESTART_GANG)
# Annotation: which failures `restart-gang` retries and which fail the gang at once, as ordered rules
# `ACTION: MATCHER, ...; ...` (trainhook/gang/failure_rules.py; docs/use/gang-lifecycle.md). Read through
# TH_FAILURE_RULES.
FAILURE_RULES = PREFIX + "failure-rules"
# Annotation: seconds the gang may run, from its first start, across restarts (then it fails).
ACTIVE_DEADLINE_SECONDS = PREFIX + "active-deadline-seconds"
# Annotation: the MPI implementation the launcher runs: OpenMPI (default), Intel or MPICH.
MPI_IMPLEMENTATION = PREFIX + "mpi-implementation"
# Annotation: MPI slots per worker (default: an integer nproc-per-node, else the pod's GPU count, else 1).
SLOTS_PER_WORKER = PREFIX + "slots-per-worker"

# Annotation: how the launcher reaches the training container: `delivered` (default: copied in by the init
# container, the command wrapped) or `none` (the gang brings its own trainhook-launch, or goes without).
LAUNCHER = PREFIX + "launcher"
LAUNCHER_DELIVERED, LAUNCHER_NONE = "delivered", "none"
LAUNCHER_MODES = (LAUNCHER_DELIVERED, LAUNCHER_NONE)
# Annotation: the training image's ENTRYPOINT as a JSON list of strings (a plain string is refused), for a
# training container without `command`: the webhook cannot read an image's entrypoint without a registry call.
ENTRYPOINT = PREFIX + "entrypoint"

USER_ANNOTATIONS = (REPLICAS, PORT, NPROC_PER_NODE, ELASTIC, MAX_RESTARTS, CONTAINER, GANG_WAIT,
                    GANG_SCHEDULER, QUEUE, MIN_AVAILABLE, PRIORITY_CLASS, SCHEDULER_NAME,
                    MPI_IMPLEMENTATION, SLOTS_PER_WORKER, ON_FAILURE, ACTIVE_DEADLINE_SECONDS, LAUNCHER, ENTRYPOINT,
                    FAILURE_RULES)
GANG_SCHEDULERS = ("kueue", "volcano", "coscheduling")

# --- Annotations the launcher writes on the workload when the gang's outcome is known --------------------------
# Never in USER_ANNOTATIONS: copied to the pod template they would roll the pods.
PHASE = PREFIX + "phase"  # Succeeded | Failed
PHASE_TIME = PREFIX + "phase-time"  # RFC 3339, UTC
PHASE_REASON = PREFIX + "phase-reason"  # one line: who ended the gang, and how
EXIT_CODE = PREFIX + "exit-code"  # the gang's exit code: 0, or the failing member's
# What a finished gang is inspected by once its pods are gone (written by the notary with the outcome, bounded):
PHASE_RANK = PREFIX + "phase-rank"  # the rank that decided the outcome (the failing one; rank 0 on success)
PHASE_POD = PREFIX + "phase-pod"  # that rank's pod
ATTEMPTS = PREFIX + "attempts"  # the attempt the outcome ended (gang restarts + 1)
START_TIME = PREFIX + "start-time"  # when the gang's first attempt started, RFC 3339 UTC
LAST_LINES = PREFIX + "last-lines"  # JSON [{"rank", "pod", "lines"}]: the deciding rank's and rank 0's last lines
OUTCOME_ANNOTATIONS = (PHASE, PHASE_TIME, PHASE_REASON, EXIT_CODE, PHASE_RANK, PHASE_POD, ATTEMPTS, START_TIME,
                       LAST_LINES)
# A running gang's progress, as its training reports it (issue 33, docs/use/progress.md): written by the notary on
# the gang's workloads from what rank 0's launcher forwards (launcher/progress.py, webhook/notary/progress.py).
PROGRESS = PREFIX + "progress"  # one human-readable line (annotation); a label "42pct"/"step-420" for kubectl get -L
PROGRESS_DETAIL = PREFIX + "progress-detail"  # JSON: percent, step, totalSteps, epoch, etaSeconds, metrics, time
PROGRESS_ANNOTATIONS = (PROGRESS, PROGRESS_DETAIL)

# --- What gang schedulers read on pods (set by the webhook; their objects come from `trainhook render`) --------
# Kueue's plain-pod group integration (kueue.x-k8s.io, v0.6+).
KUEUE_QUEUE_NAME = "kueue.x-k8s.io/queue-name"
KUEUE_POD_GROUP_NAME = "kueue.x-k8s.io/pod-group-name"
KUEUE_POD_GROUP_TOTAL_COUNT = "kueue.x-k8s.io/pod-group-total-count"
# Volcano: the scheduler's name and the PodGroup a pod belongs to.
VOLCANO_SCHEDULER = "volcano"
VOLCANO_GROUP_NAME = "scheduling.k8s.io/group-name"
VOLCANO_QUEUE_NAME = "volcano.sh/queue-name"
# The coscheduling plugin of kubernetes-sigs/scheduler-plugins: the PodGroup label and the default profile name.
COSCHEDULING_POD_GROUP = "scheduling.x-k8s.io/pod-group"
COSCHEDULING_SCHEDULER = "scheduler-plugins-scheduler"

# --- Kubernetes' own keys the webhook reads -------------------------------------------------------------------
# Set by the Job controller on Indexed Job pods (annotation since 1.21; label too since 1.28).
JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
# Set by the StatefulSet controller on its pods (the pod-index label exists only on Kubernetes >= 1.28, so the
# webhook parses the ordinal from the pod name instead).
STATEFULSET_POD_NAME = "statefulset.kubernetes.io/pod-name"
GPU_RESOURCE = "nvidia.com/gpu"

# --- The kinds a gang is made of (contract section 1) -----------------------------------------------------------
# Kinds whose pods have a stable name and index (a rank) and an address a peer can resolve before they run.
SUPPORTED_KINDS = "StatefulSet, Job (Indexed), Pod, Service"
# Kinds that make pods but not a gang (no stable index for a rank, no stable address): labeled for training, they
# are refused by name, at admission and by the CLI, instead of being taken as any unknown kind.
UNSUPPORTED_KINDS = ("Deployment", "ReplicaSet", "DaemonSet", "ReplicationController")
UNSUPPORTED_KIND_FIX = ("make it a StatefulSet (with a headless Service as its serviceName) or an Indexed Job, e.g. "
                        "with trainhook render")

# --- Frameworks and roles (contract section 2) ----------------------------------------------------------------
PYTORCH, TENSORFLOW, MPI, XGBOOST, JAX, PADDLE, MXNET = (
    "pytorch", "tensorflow", "mpi", "xgboost", "jax", "paddle", "mxnet")
# Roles per framework in rank order (Kubeflow's order: master/chief first), and each framework's main role.
ROLES: dict[str, tuple[str, ...]] = {
    PYTORCH: ("master", "worker"),
    TENSORFLOW: ("chief", "master", "ps", "worker", "evaluator"),
    MPI: ("launcher", "worker"),
    XGBOOST: ("master", "worker"),
    JAX: ("worker",),
    PADDLE: ("master", "worker"),
    MXNET: ("scheduler", "server", "worker"),
}
MAIN_ROLE: dict[str, str] = {
    PYTORCH: "worker", TENSORFLOW: "worker", MPI: "worker", XGBOOST: "worker", JAX: "worker",
    PADDLE: "worker", MXNET: "worker",
}
# Default master/coordinator port per framework (Kubeflow's defaults).
DEFAULT_PORT: dict[str, int] = {
    PYTORCH: 23456, TENSORFLOW: 2222, MPI: 0, XGBOOST: 9999, JAX: 6666, PADDLE: 36543, MXNET: 9091,
}
GANG_WAIT_MODES = ("dns", "tcp", "none")
NPROC_WORDS = ("auto", "cpu", "gpu")

# --- What the webhook injects ---------------------------------------------------------------------------------
# Name of the gang-wait init container (running `trainhook-launch wait` from the launcher image).
GANG_WAIT_CONTAINER = "trainhook-gang-wait"
# The port the gang-wait barrier listens on in `tcp` mode.
GANG_WAIT_PORT = 29499
# The delivered launcher: an emptyDir the init container fills (launcher/deliver.py), mounted read-only at
# LAUNCHER_DIR in the containers that run it; LAUNCHER_COMMAND is what their command starts with.
LAUNCHER_VOLUME = "trainhook-launcher"
LAUNCHER_DIR = "/trainhook"
LAUNCHER_COMMAND = LAUNCHER_DIR + "/bin/trainhook-launch"
# The launcher's name as users write it (on PATH in the launcher image, or in their own images).
LAUNCHER_PROGRAM = "trainhook-launch"

# PyTorch (Kubeflow PyTorchJob and torchrun's PET_* variables).
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
WORLD_SIZE = "WORLD_SIZE"
RANK = "RANK"
PET_MASTER_ADDR = "PET_MASTER_ADDR"
PET_MASTER_PORT = "PET_MASTER_PORT"
PET_NNODES = "PET_NNODES"
PET_NODE_RANK = "PET_NODE_RANK"
PET_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
PET_RDZV_BACKEND = "PET_RDZV_BACKEND"
PET_RDZV_ENDPOINT = "PET_RDZV_ENDPOINT"
PET_RDZV_ID = "PET_RDZV_ID"
PET_MAX_RESTARTS = "PET_MAX_RESTARTS"
PYTHONUNBUFFERED = "PYTHONUNBUFFERED"

# Always injected, into the training container and the gang-wait init container: the gang's identity and how to
# address every peer, so the launcher needs no API call. Read by trainhook.launcher.
TH_FRAMEWORK = "TRAINHOOK_FRAMEWORK"
TH_JOB_NAME = "TRAINHOOK_JOB_NAME"
TH_NAMESPACE = "TRAINHOOK_NAMESPACE"
TH_ROLE = "TRAINHOOK_ROLE"
TH_INDEX = "TRAINHOOK_INDEX"
TH_RANK = "TRAINHOOK_RANK"
# The shape, `role=count,...` in rank order.
TH_REPLICAS = "TRAINHOOK_REPLICAS"
# Hostname prefix per role, `role=prefix,...`: peer i of a role is `<prefix>-<i>.<subdomain>`.
TH_HOSTS = "TRAINHOOK_HOSTS"
TH_SUBDOMAIN = "TRAINHOOK_SUBDOMAIN"
# This pod's own address, `<hostname>.<subdomain>`.
TH_ADDRESS = "TRAINHOOK_ADDRESS"
TH_PORT = "TRAINHOOK_PORT"
TH_GANG_WAIT = "TRAINHOOK_GANG_WAIT"
TH_GANG_WAIT_PORT = "TRAINHOOK_GANG_WAIT_PORT"
# Seconds the gang wait gives peers before failing with the list of those missing.
TH_WAIT_TIMEOUT = "TRAINHOOK_WAIT_TIMEOUT"
# An elastic PyTorch gang's `min:max` members (the `elastic` annotation), set only for elastic gangs: the gang
# wait (which has no PET_* variables) waits for `min` members instead of all `max` its TRAINHOOK_REPLICAS allows.
TH_ELASTIC = "TRAINHOOK_ELASTIC"
# The gang's lifecycle (read by the launcher's `run`): the on-failure policy and restart budget, the deadline
# (injected only when the annotations are set; the launcher's defaults are fail-gang and 3), the pod's
# controller `<Kind>/<name>` (`Pod/<name>` for a bare pod) and its restartPolicy (whether a finished member
# exits, as Job pods do, or parks, as StatefulSet pods must).
TH_ON_FAILURE = "TRAINHOOK_ON_FAILURE"
TH_MAX_RESTARTS = "TRAINHOOK_MAX_RESTARTS"
TH_ACTIVE_DEADLINE = "TRAINHOOK_ACTIVE_DEADLINE_SECONDS"
TH_FAILURE_RULES = "TRAINHOOK_FAILURE_RULES"
TH_WORKLOAD = "TRAINHOOK_WORKLOAD"
TH_RESTART_POLICY = "TRAINHOOK_RESTART_POLICY"
# Where rank 0's launcher coordinates the gang (MPI control uses 29498, the gang wait 29499).
TH_COORDINATOR_PORT = "TRAINHOOK_COORDINATOR_PORT"
COORDINATOR_PORT = 29497
# The gang's token: HMAC-SHA256 of `<namespace>/<job-name>` under a key only the webhook holds. The launchers
# authenticate their coordination messages with it, so nothing outside the gang can end or restart it.
TH_GANG_TOKEN = "TRAINHOOK_GANG_TOKEN"
# Variables a user may set on the launcher's container (not injected; launcher/policy.py reads them):
TH_STATE_DIR = "TRAINHOOK_STATE_DIR"  # a directory that outlives the container (an emptyDir): the outcome marker
TH_FINISH_GRACE = "TRAINHOOK_FINISH_GRACE"  # seconds members still running get after rank 0 succeeded
TH_STOP_GRACE = "TRAINHOOK_STOP_GRACE"  # seconds between SIGTERM and SIGKILL when a member's training is stopped
TH_SERVICE_ACCOUNT_DIR = "TRAINHOOK_SERVICE_ACCOUNT_DIR"  # the pod's API token, for the MPI kubexec transport only
# Where the pod's identity token for the notary is (default: IDENTITY_DIR/token, the file of the projected volume
# the webhook injects), for tests and images that mount it elsewhere.
TH_IDENTITY_TOKEN = "TRAINHOOK_IDENTITY_TOKEN"
# Set by `trainhook local` on the training container: the file the launcher keeps its state in, for the runner.
TH_LOCAL_STATUS = "TRAINHOOK_LOCAL_STATUS"
# Seconds the coordinator waits, when a member's failure is fatal only by the default rule (exit 1-127), for a
# failure that shows what caused it: a member whose peer was killed often exits 1 before the killed one's exit
# (137) arrives, and the killed one's is the gang's real failure
# (launcher/coordination/coordinator_rules.py CoordinatorState._failure).
TH_FAILURE_SETTLE = "TRAINHOOK_FAILURE_SETTLE"
# Given by the gang-aware launcher to its training command, per attempt (launcher/policy.py attempt_env): the
# gang's attempt this process belongs to (1, 2, ...; a nested `run` sees it and runs its command alone) and the
# gang restarts so far (attempt - 1).
TH_ATTEMPT = "TRAINHOOK_ATTEMPT"
TH_RESTARTS = "TRAINHOOK_RESTARTS"
# Given by rank 0's gang-aware launcher to its training command (launcher/progress.py): the file the training may
# append JSON lines of progress and metrics to; the launcher forwards the latest through the notary.
TH_PROGRESS_FILE = "TRAINHOOK_PROGRESS_FILE"
# Seconds between two reports rank 0 forwards to the notary (launcher/progress.py; at least its MIN_INTERVAL).
TH_PROGRESS_INTERVAL = "TRAINHOOK_PROGRESS_INTERVAL"

# --- The notary (issue 22, docs/operate/security.md) ------------------------------------------------------------------
# The pod's identity: a projected serviceAccountToken (audience IDENTITY_AUDIENCE) the webhook mounts read-only at
# IDENTITY_DIR (file `token`) from the volume IDENTITY_VOLUME. The launcher presents it to the notary, which
# checks it with a TokenReview (under `trainhook local`, the runner writes a random per-pod token there instead).
IDENTITY_VOLUME = "trainhook-identity"
IDENTITY_DIR = "/var/run/secrets/trainhook.dev/identity"
IDENTITY_AUDIENCE = "trainhook"
# The notary's base URL (https://<service>.<namespace>.svc:<port>) and the PEM CA bundle that verifies it,
# injected by the webhook into the launcher's containers.
TH_NOTARY = "TRAINHOOK_NOTARY"
TH_NOTARY_CA = "TRAINHOOK_NOTARY_CA"

# --- TRAINHOOK_* read by the launcher's MPI transports and `trainhook local` -------------------------------------
# Injected by the webhook (webhook/admission/frameworks/mpi.py): the MPI implementation (launcher only) and this pod's
# slots (every pod: a worker reports its own to the launcher, which writes them into the hostfile).
TH_MPI_IMPLEMENTATION = "TRAINHOOK_MPI_IMPLEMENTATION"
TH_MPI_SLOTS = "TRAINHOOK_MPI_SLOTS"
# A user's choice of how mpirun reaches the workers: gang, kubexec, ssh or local (launcher/mpi/kubexec.py).
TH_MPI_TRANSPORT = "TRAINHOOK_MPI_TRANSPORT"
# Set by `trainhook local` on its pods: the run's directory (launcher/mpi/local_transport.py), and a mark on every
# process of one container, which finds them all when the container ends (trainhook/local/containers.py).
TH_LOCAL_RUN_DIR = "TRAINHOOK_LOCAL_RUN_DIR"
TH_LOCAL_CONTAINER = "TRAINHOOK_LOCAL_CONTAINER"

# --- Known keys: a misspelled key is worse than an error (issue 25) ---------------------------------------------
# Every constant of this module under PREFIX is a key trainhook reads or writes, so the known keys are collected
# from the module itself (`known_keys`): a key added above is known everywhere at once. These are labels (what
# selectors and `kubectl get -l` read); PHASE is written as both; every other key is an annotation.
LABEL_KEYS = (FRAMEWORK, JOB_NAME, ROLE, INDEX, PHASE)
BOTH_KEYS = (PHASE,)


_KNOWN: list = []  # filled on first use, once every constant of the module exists


def known_keys() -> tuple:
    """(label keys, annotation keys): every PREFIX constant of this module, placed as LABEL_KEYS says."""
    if not _KNOWN:
        every = {value for name, value in globals().items()
                 if name.isupper() and isinstance(value, str) and value.startswith(PREFIX) and value != PREFIX}
        _KNOWN.append((frozenset(LABEL_KEYS), frozenset(every - set(LABEL_KEYS)) | frozenset(BOTH_KEYS)))
    return _KNOWN[0]


def nearest_key(key: str) -> str:
    """The known key closest to a misspelled one (difflib), or '' when none is close."""
    import difflib

    labels, annotations = known_keys()
    names = sorted(k[len(PREFIX):] for k in labels | annotations)
    found = difflib.get_close_matches(key[len(PREFIX):], names, n=1, cutoff=0.6)
    return PREFIX + found[0] if found else ""


def unknown_keys(labels: object, annotations: object, where: str = "metadata") -> list:
    """One line per PREFIX key of an object's labels or annotations that trainhook never reads where it is
    written: a key it does not know (naming the nearest one it knows), or a label written as an annotation or
    the other way round. `where` is the metadata's path (`spec.template.metadata` for a pod template).

    Used by the webhook (as admission warnings) and by render, convert, explain and `trainhook local` (which
    refuse): a typo there is silently ignored, and a misspelled gate label makes a gang of independent pods."""
    known_labels, known_annotations = known_keys()
    found = []
    for field, mapping, known, other, other_field in (
            ("labels", labels, known_labels, known_annotations, "annotation"),
            ("annotations", annotations, known_annotations, known_labels, "label")):
        if not isinstance(mapping, dict):
            continue
        for key in mapping:
            if not isinstance(key, str) or not key.startswith(PREFIX) or key in known:
                continue
            if key in other:
                found.append(f"{where}.{field}: {key} is a trainhook {other_field}, not "
                             f"{'an annotation' if field == 'annotations' else 'a label'}; trainhook ignores it here: "
                             f"move it to {where}.{other_field}s")
                continue
            near = nearest_key(key)
            hint = f"did you mean {near}?" if near else "see the keys in docs/use/contract.md section 2"
            found.append(f"{where}.{field}: {key} is not a trainhook key ({hint}); trainhook ignores it: "
                         f"{'correct it' if near else 'remove it'}")
    return found
