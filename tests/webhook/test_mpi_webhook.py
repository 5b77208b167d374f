"""MPI on the webhook side: the injected environment per implementation against Kubeflow's, variable by variable;
hostfile formats as the real OpenMPI and MPICH launchers read them; shapes; the /etc/mpi volume; whole pods.

Kubeflow's values are golden data transcribed from its sources (each table cites them); our addresses differ
(contract section 3) and the differences are listed, with their reason, in NOT_INJECTED.
"""

from __future__ import annotations

import copy
import subprocess

import pytest

import expected
from objects import container, indexed_job, pod_of_job, pod_of_statefulset, statefulset
from trainhook.gang import keys
from trainhook.webhook.admission.frameworks import mpi
from trainhook.webhook.admission.member import Denied, Member, Problems, parse_shape
from trainhook.webhook.admission.mutate import mutate
from trainhook.webhook.settings import Settings

SETTINGS = Settings(launcher_image="registry.example/launcher:1", wait_timeout=300)
HOSTFILE, AGENT = "/etc/mpi/hostfile", "/etc/mpi/kubexec.sh"

# --- Kubeflow's launcher variables, per implementation ---------------------------------------------------------
# kubeflow/mpi-operator pkg/controller/mpi_job_controller.go (v2beta1): launcherEnvVars (K_MPI_JOB_ROLE),
# ompiEnvVars (keep_fqdn, default_hostfile), intelEnvVars (I_MPI_HYDRA_HOST_FILE), mpichEnvVars
# (HYDRA_HOST_FILE), openMPISlotsEnv/intelMPISlotsEnv = slotsPerWorker, nvidiaDisableEnvVars (both empty).
# kubeflow/training-operator pkg/controller.v1/mpi/mpijob_controller.go (v1, `newLauncher`):
# OMPI_MCA_plm_rsh_agent=/etc/mpi/kubexec.sh, OMPI_MCA_orte_default_hostfile=/etc/mpi/hostfile, and the NVIDIA
# pair when the launcher requests no GPU (`isGPULauncher`). The rsh bootstrap variables of Intel MPI and MPICH
# are the contract's (section 4): Kubeflow v2 uses ssh there, v1 supported OpenMPI only.
KUBEFLOW_LAUNCHER = {
    mpi.OPENMPI: {"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
                  "OMPI_MCA_orte_default_hostfile": HOSTFILE, "OMPI_MCA_plm_rsh_agent": AGENT,
                  "OMPI_MCA_orte_set_default_slots": "4"},
    mpi.INTEL: {"K_MPI_JOB_ROLE": "launcher", "I_MPI_HYDRA_HOST_FILE": HOSTFILE, "I_MPI_PERHOST": "4",
                "I_MPI_HYDRA_BOOTSTRAP": "rsh", "I_MPI_HYDRA_BOOTSTRAP_EXEC": AGENT},
    mpi.MPICH: {"K_MPI_JOB_ROLE": "launcher", "HYDRA_HOST_FILE": HOSTFILE, "HYDRA_LAUNCHER": "rsh",
                "HYDRA_LAUNCHER_EXEC": AGENT},
}
NVIDIA_OFF = {"NVIDIA_VISIBLE_DEVICES": "", "NVIDIA_DRIVER_CAPABILITIES": ""}
# Kubeflow variables trainhook does not inject, and why.
NOT_INJECTED = {
    # mpi-operator v2's ssh options for mpirun's agent: with the ssh transport, trainhook's agent passes
    # `-o ConnectionAttempts=10` to ssh itself; with kubexec they would mean nothing. (HYDRA_LAUNCH_EXTRA_ARGS
    # is not even read by Hydra 4.0.2, whose variable is HYDRA_LAUNCHER_EXTRA_ARGS.)
    "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
    "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS": "-o ConnectionAttempts=10",
    "HYDRA_LAUNCH_EXTRA_ARGS": "-o ConnectionAttempts=10",
}
# trainhook's own, read by `trainhook-launch mpirun`.
TRAINHOOK_LAUNCHER = {"TRAINHOOK_MPI_SLOTS": "4"}


def member(role: str = "launcher", index: int = 0, shape: str = "launcher=1,worker=2", **options: str) -> Member:
    problems = Problems()
    parsed = parse_shape(shape, "mpi", problems)
    assert parsed is not None and not problems
    hosts = {r: f"pi-{r}" for r in parsed.roles}
    return Member("mpi", "pi", "team-a", role, index, parsed, hosts, "pi", 29498,
                  {keys.PREFIX + k.replace("_", "-"): v for k, v in options.items()})


def built(m: Member, gpus: int = 0) -> tuple[dict[str, str], list[str]]:
    problems = Problems()
    env = mpi.build_env(m, gpus, problems)
    assert len({name for name, _ in env}) == len(env), "a variable is injected twice"
    return dict(env), list(problems)


@pytest.mark.parametrize("implementation", mpi.IMPLEMENTATIONS)
def test_the_launcher_gets_kubeflows_variables_and_nothing_else(implementation):
    env, problems = built(member(mpi_implementation=implementation, slots_per_worker="4"))
    assert problems == []
    expected = {**KUBEFLOW_LAUNCHER[implementation], **NVIDIA_OFF, **TRAINHOOK_LAUNCHER,
                "TRAINHOOK_MPI_IMPLEMENTATION": implementation}
    for name, value in expected.items():
        assert env.get(name) == value, f"{implementation}: {name}"
    assert set(env) == set(expected)
    assert not set(env) & set(NOT_INJECTED)


def test_other_implementations_variables_are_not_injected():
    openmpi, _ = built(member(mpi_implementation="OpenMPI"))
    mpich, _ = built(member(mpi_implementation="MPICH"))
    assert not any(name.startswith(("HYDRA_", "I_MPI_")) for name in openmpi)
    assert not any(name.startswith(("OMPI_", "I_MPI_")) for name in mpich)


def test_the_default_implementation_is_openmpi():
    env, _ = built(member())
    assert env["TRAINHOOK_MPI_IMPLEMENTATION"] == "OpenMPI"
    assert env["OMPI_MCA_plm_rsh_agent"] == AGENT


def test_a_launcher_with_gpus_keeps_them_visible():
    env, _ = built(member(), gpus=2)
    assert "NVIDIA_VISIBLE_DEVICES" not in env and "NVIDIA_DRIVER_CAPABILITIES" not in env


def test_workers_get_their_role_and_slots_only():
    env, problems = built(member("worker", 1, slots_per_worker="4"))
    assert (env, problems) == ({"K_MPI_JOB_ROLE": "worker", "TRAINHOOK_MPI_SLOTS": "4"}, [])


@pytest.mark.parametrize("options,gpus,slots", [
    ({}, 0, "1"),  # Kubeflow's default slotsPerWorker
    ({}, 8, "8"),  # nproc-per-node auto: one slot per GPU
    ({"nproc_per_node": "gpu"}, 4, "4"),
    ({"nproc_per_node": "3"}, 8, "3"),
    ({"slots_per_worker": "2", "nproc_per_node": "3"}, 8, "2"),  # the annotation wins
])
def test_slots_per_worker_come_from_the_annotation_then_nproc_per_node_then_the_gpus(options, gpus, slots):
    env, problems = built(member("worker", 0, **options), gpus=gpus)
    assert (env["TRAINHOOK_MPI_SLOTS"], problems) == (slots, [])


@pytest.mark.parametrize("options,problem", [
    ({"mpi_implementation": "openmpi"}, "trainhook.dev/mpi-implementation='openmpi': not an MPI implementation "
                                        "trainhook knows; use one of OpenMPI, Intel, MPICH"),
    ({"slots_per_worker": "0"}, "trainhook.dev/slots-per-worker='0': not a slot count; use a positive integer"),
    ({"nproc_per_node": "cpu"}, "trainhook.dev/nproc-per-node='cpu': an MPI gang needs a slot count per worker, "
                                "which 'cpu' does not give at admission; set trainhook.dev/slots-per-worker or an "
                                "integer trainhook.dev/nproc-per-node"),
])
def test_unusable_options_are_refused_naming_the_key_and_the_fix(options, problem):
    _, problems = built(member(**options))
    assert problems == [problem]


@pytest.mark.parametrize("shape,problem", [
    ("launcher=2,worker=2", "an MPI gang has one launcher (it runs mpirun); set launcher=1, or leave the launcher "
                            "role out so that worker 0 launches"),
    ("launcher=1", "an MPI gang needs workers (the hosts of the hostfile); add worker=N with N >= 1"),
])
def test_shapes_mpi_cannot_run_are_refused(shape, problem):
    problems = Problems()
    mpi.check_shape(parse_shape(shape, "mpi", Problems()), problems)
    assert problems == [f"trainhook.dev/replicas={shape!r}: {problem}"]


def test_worker_0_launches_when_the_gang_has_no_launcher_role():
    workers_only = parse_shape("worker=3", "mpi", Problems())
    with_launcher = parse_shape("launcher=1,worker=3", "mpi", Problems())
    assert [mpi.is_launcher("worker", i, workers_only) for i in range(3)] == [True, False, False]
    assert [mpi.is_launcher("worker", i, with_launcher) for i in range(3)] == [False, False, False]
    assert mpi.is_launcher("launcher", 0, with_launcher)
    env, _ = built(member("worker", 0, "worker=3"))
    assert env["K_MPI_JOB_ROLE"] == "launcher" and env["OMPI_MCA_orte_default_hostfile"] == HOSTFILE


# --- Hostfile formats ----------------------------------------------------------------------------------------

def test_hostfile_lines_per_implementation():
    hosts = [("pi-worker-0.pi", 2), ("pi-worker-1.pi", 4)]
    assert mpi.hostfile(hosts, "OpenMPI") == "pi-worker-0.pi slots=2\npi-worker-1.pi slots=4\n"
    assert mpi.hostfile(hosts, "Intel") == "pi-worker-0.pi:2\npi-worker-1.pi:4\n"
    assert mpi.hostfile(hosts, "MPICH") == "pi-worker-0.pi:2\npi-worker-1.pi:4\n"


def run_hostname(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_openmpi_reads_its_hostfile_line_and_places_that_many_processes(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(mpi.hostfile([("localhost", 3)], "OpenMPI"))
    done = run_hostname(["mpirun.openmpi", "--allow-run-as-root", "--hostfile", str(hostfile), "hostname"])
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) == 3  # no -np: one process per slot of the hostfile
    over = run_hostname(["mpirun.openmpi", "--allow-run-as-root", "--hostfile", str(hostfile), "-np", "4", "hostname"])
    assert over.returncode != 0 and "not enough slots" in (over.stdout + over.stderr)


def test_mpich_reads_its_hostfile_line_and_refuses_openmpis(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(mpi.hostfile([("localhost", 2)], "MPICH"))
    done = run_hostname(["mpiexec.mpich", "-f", str(hostfile), "-n", "2", "hostname"])
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) == 2
    hostfile.write_text(mpi.hostfile([("localhost", 2)], "OpenMPI"))
    refused = run_hostname(["mpiexec.mpich", "-f", str(hostfile), "-n", "2", "hostname"])
    assert refused.returncode != 0


# --- Whole pods through the webhook ----------------------------------------------------------------------------

def mpi_labels(**more: str) -> dict:
    return {"trainhook.dev/framework": "mpi", **{f"trainhook.dev/{k.replace('_', '-')}": v for k, v in more.items()}}


def wired(pod: dict, framework_env: dict, gang: dict, words: tuple[str, ...] = ("mpirun", "--"),
          **spec: object) -> dict:
    """`pod` as the webhook should return it (expected.wired, its command under the MPI launcher command
    `words`), plus the /etc/mpi emptyDir on the container, before the launcher's."""
    user_env = pod["spec"]["containers"][0].get("env")
    pod = expected.wired(pod, framework_env, gang, user_env=user_env, words=words, **spec)
    c = pod["spec"]["containers"][0]
    c["volumeMounts"].insert(-1, {"name": "mpi-job-config", "mountPath": "/etc/mpi"})
    pod["spec"]["volumes"].insert(-1, {"name": "mpi-job-config", "emptyDir": {}})
    return pod


def gang_env(job: str, role: str, index: int, rank: int, replicas: str, hosts: str, address: str) -> dict:
    # MPI has no master port: TRAINHOOK_PORT is 0 and the workers listen on 29498 (or the port annotation).
    return expected.gang_env("mpi", job, role, index, rank, replicas, hosts, job, address, port="0")


SHAPE = "launcher=1,worker=2"
HOSTS = "launcher=pi-launcher,worker=pi-worker"
MPI_CONTAINER = container("mpi", env=[{"name": "EPOCHS", "value": "3"}])
stamped = expected.stamped
LAUNCHER_JOB = stamped(indexed_job("pi-launcher", 1, labels=mpi_labels(job_name="pi", role="launcher"),
                                   annotations={"trainhook.dev/replicas": SHAPE}, containers=[MPI_CONTAINER]),
                       SHAPE, "launcher", "pi")
LAUNCHER_POD = pod_of_job(LAUNCHER_JOB, 0)
WORKER_JOB = stamped(indexed_job("pi-worker", 2, labels=mpi_labels(job_name="pi", role="worker"),
                                 annotations={"trainhook.dev/replicas": SHAPE}, containers=[container("mpi")]),
                     SHAPE, "worker", "pi")
WORKER_POD = pod_of_job(WORKER_JOB, 1)
SINGLE = stamped(statefulset("ring", 3, labels=mpi_labels(), containers=[container("mpi", gpus=1)]),
                 "worker=3", "worker", "ring")
SINGLE_0, SINGLE_2 = pod_of_statefulset(SINGLE, 0), pod_of_statefulset(SINGLE, 2)
OPENMPI_LAUNCHER = {"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
                    "OMPI_MCA_orte_default_hostfile": HOSTFILE, "OMPI_MCA_plm_rsh_agent": AGENT}

CASES = [
    ("the launcher of a launcher+workers gang: Kubeflow's variables, no GPU, /etc/mpi", LAUNCHER_POD,
     wired(LAUNCHER_POD, {**OPENMPI_LAUNCHER, "OMPI_MCA_orte_set_default_slots": "1", **NVIDIA_OFF,
                          "TRAINHOOK_MPI_IMPLEMENTATION": "OpenMPI", "TRAINHOOK_MPI_SLOTS": "1"},
           gang_env("pi", "launcher", 0, 0, SHAPE, HOSTS, "pi-launcher-0.pi"), hostname="pi-launcher-0",
           subdomain="pi")),
    ("a worker: its role and slots, /etc/mpi for the agent OpenMPI's orted looks for", WORKER_POD,
     wired(WORKER_POD, {"K_MPI_JOB_ROLE": "worker", "TRAINHOOK_MPI_SLOTS": "1"},
           gang_env("pi", "worker", 1, 2, SHAPE, HOSTS, "pi-worker-1.pi"), ("mpi-worker", "--"),
           hostname="pi-worker-1", subdomain="pi")),
    ("one StatefulSet: pod 0 launches, with its GPU, one slot per GPU", SINGLE_0,
     wired(SINGLE_0, {**OPENMPI_LAUNCHER, "OMPI_MCA_orte_set_default_slots": "1",
                      "TRAINHOOK_MPI_IMPLEMENTATION": "OpenMPI", "TRAINHOOK_MPI_SLOTS": "1"},
           gang_env("ring", "worker", 0, 0, "worker=3", "worker=ring", "ring-0.ring"),
           tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])),
    ("one StatefulSet: the other pods are workers", SINGLE_2,
     wired(SINGLE_2, {"K_MPI_JOB_ROLE": "worker", "TRAINHOOK_MPI_SLOTS": "1"},
           gang_env("ring", "worker", 2, 2, "worker=3", "worker=ring", "ring-2.ring"),
           tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])),
]


@pytest.mark.parametrize("name,given,expected", CASES, ids=[c[0] for c in CASES])
def test_mutation_yields_the_whole_expected_pod(name, given, expected):
    before = copy.deepcopy(given)
    assert mutate("Pod", "CREATE", given, "team-a", SETTINGS).obj == expected
    assert given == before


@pytest.mark.parametrize("given", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_mutating_twice_equals_mutating_once(given):
    once = mutate("Pod", "CREATE", given, "team-a", SETTINGS).obj
    assert mutate("Pod", "CREATE", once, "team-a", SETTINGS).obj == once


def test_the_implementation_and_slots_annotations_on_the_workload_reach_the_launcher():
    job = indexed_job("pi-launcher", 1, labels=mpi_labels(job_name="pi", role="launcher"),
                      annotations={"trainhook.dev/replicas": SHAPE, "trainhook.dev/mpi-implementation": "MPICH",
                                   "trainhook.dev/slots-per-worker": "4"}, containers=[container("mpi")])
    admitted_job = mutate("Job", "CREATE", job, "team-a", SETTINGS).obj
    pod = mutate("Pod", "CREATE", pod_of_job(admitted_job, 0), "team-a", SETTINGS).obj
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert (env["HYDRA_HOST_FILE"], env["HYDRA_LAUNCHER"], env["HYDRA_LAUNCHER_EXEC"]) == (HOSTFILE, "rsh", AGENT)
    assert (env["TRAINHOOK_MPI_IMPLEMENTATION"], env["TRAINHOOK_MPI_SLOTS"]) == ("MPICH", "4")
    assert not any(name.startswith("OMPI_") for name in env)


def test_a_users_own_etc_mpi_mount_is_kept():
    own = container("mpi")
    own["volumeMounts"] = [{"name": "mine", "mountPath": "/etc/mpi"}]
    job = stamped(indexed_job("pi-launcher", 1, labels=mpi_labels(job_name="pi", role="launcher"),
                              annotations={"trainhook.dev/replicas": SHAPE}, containers=[own]), SHAPE, "launcher", "pi")
    pod = pod_of_job(job, 0)
    pod["spec"]["volumes"] = [{"name": "mine", "emptyDir": {}}]
    spec = mutate("Pod", "CREATE", pod, "team-a", SETTINGS).obj["spec"]
    assert spec["volumes"] == [{"name": "mine", "emptyDir": {}}, expected.LAUNCHER_VOLUME]
    assert spec["containers"][0]["volumeMounts"] == [{"name": "mine", "mountPath": "/etc/mpi"},
                                                     expected.LAUNCHER_MOUNT]


def test_a_volume_named_like_ours_elsewhere_is_refused_with_the_fix():
    pod = copy.deepcopy(LAUNCHER_POD)
    pod["spec"]["volumes"] = [{"name": "mpi-job-config", "emptyDir": {}}]
    with pytest.raises(Denied) as denied:
        mutate("Pod", "CREATE", pod, "team-a", SETTINGS)
    assert denied.value.problems == [
        "spec.volumes='mpi-job-config': the name of the volume trainhook mounts at /etc/mpi in MPI pods; "
        "rename your volume, or mount it at /etc/mpi yourself"]


def test_a_two_launcher_gang_is_refused_at_apply():
    job = indexed_job("pi-launcher", 2, labels=mpi_labels(job_name="pi", role="launcher"),
                      annotations={"trainhook.dev/replicas": "launcher=2,worker=2"}, containers=[container("mpi")])
    with pytest.raises(Denied) as denied:
        mutate("Job", "CREATE", job, "team-a", SETTINGS)
    assert any("an MPI gang has one launcher" in p for p in denied.value.problems)

