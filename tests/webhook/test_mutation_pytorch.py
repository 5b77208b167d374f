"""Table-driven PyTorch mutation tests: each case is a whole input object and the whole expected object."""

from __future__ import annotations

import copy

import pytest

from trainhook.webhook.admission.mutate import mutate
from trainhook.webhook.settings import Settings
from expected import stamped, wired
from expected import gang_env as any_gang_env
from objects import bare_pod, container, indexed_job, pod_of_job, pod_of_statefulset, service, statefulset

SETTINGS = Settings(launcher_image="registry.example/launcher:1", wait_timeout=300)


def gang_env(*args, **kwargs) -> dict:
    return any_gang_env("pytorch", *args, **kwargs)


def torch_env(master: str, world: int, rank: int, nproc: str = "1", nnodes: str | None = None) -> dict:
    return dict(MASTER_ADDR=master, MASTER_PORT="23456", WORLD_SIZE=str(world), RANK=str(rank),
                PET_MASTER_ADDR=master, PET_MASTER_PORT="23456", PET_NNODES=nnodes or str(world),
                PET_NODE_RANK=str(rank), PET_NPROC_PER_NODE=nproc, PYTHONUNBUFFERED="1")


STS = statefulset("ddp", 4)
STS_STAMPED = stamped(STS, "worker=4")
MASTER = statefulset("big-master", 1, labels={"trainhook.dev/job-name": "big", "trainhook.dev/role": "master"},
                     annotations={"trainhook.dev/replicas": "master=1,worker=2"}, service="big")
WORKERS = statefulset("big-worker", 2, labels={"trainhook.dev/job-name": "big", "trainhook.dev/role": "worker"},
                      annotations={"trainhook.dev/replicas": "master=1,worker=2"}, service="big")
JOB = indexed_job("ij", 3)
GPU_STS = stamped(statefulset("gpu", 2, containers=[container(gpus=8)]), "worker=2")
# An elastic gang's template carries its largest shape (max members), whatever spec.replicas is (contract 4).
ELASTIC = stamped(statefulset("el", 3, annotations={"trainhook.dev/elastic": "2:4"}), "worker=4")
ELASTIC["spec"]["template"]["metadata"]["annotations"]["trainhook.dev/elastic"] = "2:4"
USER_ENV = [{"name": "RANK", "value": "7"}, {"name": "LR", "value": "$(WORLD_SIZE)"}]
USER_ENV_STS = stamped(statefulset("mine", 2, containers=[container(env=USER_ENV)]), "worker=2")
BARE = bare_pod("solo", {"trainhook.dev/job-name": "solo", "trainhook.dev/index": "1"},
                {"trainhook.dev/replicas": "worker=2", "trainhook.dev/gang-wait": "tcp"})


def big_worker_pod(index: int) -> dict:
    return pod_of_statefulset(stamped(WORKERS, "master=1,worker=2", job="big"), index)


def with_annotation(sts: dict, key: str, value: str) -> dict:
    sts = copy.deepcopy(sts)
    sts["spec"]["template"]["metadata"].setdefault("annotations", {})[key] = value
    return sts


CASES = [
    ("a single StatefulSet is stamped and made Parallel", "StatefulSet", STS,
     {**STS_STAMPED, "spec": {**STS_STAMPED["spec"], "podManagementPolicy": "Parallel"}}),
    ("a StatefulSet pod gets its rank from its ordinal", "Pod", pod_of_statefulset(STS_STAMPED, 2),
     wired(pod_of_statefulset(STS_STAMPED, 2), torch_env("ddp-0.ddp", 4, 2),
           gang_env("ddp", "worker", 2, 2, "worker=4", "worker=ddp", "ddp", "ddp-2.ddp"))),
    ("a worker of a master+worker gang ranks after the master", "Pod", big_worker_pod(1),
     wired(big_worker_pod(1), torch_env("big-master-0.big", 3, 2),
           gang_env("big", "worker", 1, 2, "master=1,worker=2", "master=big-master,worker=big-worker", "big",
                    "big-worker-1.big"))),
    ("an Indexed Job pod gets its rank from the completion index and its address", "Pod",
     pod_of_job(stamped(JOB, "worker=3"), 1),
     wired(pod_of_job(stamped(JOB, "worker=3"), 1), torch_env("ij-0.ij", 3, 1),
           gang_env("ij", "worker", 1, 1, "worker=3", "worker=ij", "ij", "ij-1.ij"), hostname="ij-1",
           subdomain="ij")),
    ("a bare pod gets a stable hostname and subdomain", "Pod", BARE,
     wired(BARE, torch_env("solo-worker-0.solo", 2, 1),
           gang_env("solo", "worker", 1, 1, "worker=2", "worker=solo-worker", "solo", "solo-worker-1.solo",
                    wait="tcp"), hostname="solo-worker-1", subdomain="solo")),
    ("a GPU pod runs one process per GPU and tolerates the GPU taint", "Pod", pod_of_statefulset(GPU_STS, 1),
     wired(pod_of_statefulset(GPU_STS, 1), torch_env("gpu-0.gpu", 2, 1, nproc="8"),
           gang_env("gpu", "worker", 1, 1, "worker=2", "worker=gpu", "gpu", "gpu-1.gpu"),
           tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])),
    ("an explicit nproc-per-node multiplies WORLD_SIZE", "Pod",
     pod_of_statefulset(with_annotation(STS_STAMPED, "trainhook.dev/nproc-per-node", "4"), 0),
     wired(pod_of_statefulset(with_annotation(STS_STAMPED, "trainhook.dev/nproc-per-node", "4"), 0),
           {**torch_env("ddp-0.ddp", 16, 0, nproc="4"), "PET_NNODES": "4"},
           gang_env("ddp", "worker", 0, 0, "worker=4", "worker=ddp", "ddp", "ddp-0.ddp"))),
    ("an elastic gang gets a c10d rendezvous", "Pod", pod_of_statefulset(ELASTIC, 0),
     wired(pod_of_statefulset(ELASTIC, 0),
           # No WORLD_SIZE or RANK: the size changes while the pods run; torchrun's rendezvous sets both.
           {**{k: v for k, v in torch_env("el-0.el", 4, 0, nnodes="2:4").items() if k not in ("WORLD_SIZE", "RANK")},
            "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "el-0.el:23456", "PET_RDZV_ID": "el",
            "PET_MAX_RESTARTS": "3"},
           # TRAINHOOK_ELASTIC: the gang wait and the launcher wait for min members, not the max of the shape.
           {**gang_env("el", "worker", 0, 0, "worker=4", "worker=el", "el", "el-0.el"), "TRAINHOOK_ELASTIC": "2:4"})),
    ("the user's variables are kept and come after the injected ones", "Pod", pod_of_statefulset(USER_ENV_STS, 1),
     wired(pod_of_statefulset(USER_ENV_STS, 1),
           {k: v for k, v in torch_env("mine-0.mine", 2, 1).items() if k != "RANK"},
           gang_env("mine", "worker", 1, 1, "worker=2", "worker=mine", "mine", "mine-1.mine"), user_env=USER_ENV)),
    ("a labeled Service becomes headless and publishes not-ready addresses", "Service", service("ddp"),
     {**service("ddp"), "spec": {**service("ddp")["spec"], "clusterIP": "None", "publishNotReadyAddresses": True}}),
]


@pytest.mark.parametrize("name,kind,given,expected", CASES, ids=[c[0] for c in CASES])
def test_mutation_yields_the_whole_expected_object(name, kind, given, expected):
    before = copy.deepcopy(given)
    assert mutate(kind, "CREATE", given, "team-a", SETTINGS).obj == expected
    assert given == before, "the input object must not be modified"


def test_indexed_job_is_stamped_and_given_a_subdomain():
    job = indexed_job("ij", 3)
    expected = stamped(job, "worker=3")
    expected["spec"]["template"]["spec"]["subdomain"] = "ij"
    assert mutate("Job", "CREATE", job, "team-a", SETTINGS).obj == expected


def test_a_kept_user_variable_is_reported_as_a_warning():
    result = mutate("Pod", "CREATE", pod_of_statefulset(USER_ENV_STS, 1), "team-a", SETTINGS)
    assert result.warnings == ["container trainer: kept your RANK=7; trainhook would set 1"]


def test_objects_without_the_label_are_returned_untouched():
    pod = bare_pod("plain", {}, {})
    del pod["metadata"]["labels"]["trainhook.dev/framework"]
    assert mutate("Pod", "CREATE", pod, "team-a", SETTINGS).obj is pod
    plain_service = service("x")
    plain_service["metadata"]["labels"] = {}
    assert mutate("Service", "CREATE", plain_service, "team-a", SETTINGS).obj is plain_service


def test_statefulset_update_that_scales_restamps_the_shape():
    created = mutate("StatefulSet", "CREATE", STS, "team-a", SETTINGS).obj
    scaled = copy.deepcopy(created)
    scaled["spec"]["replicas"] = 6
    updated = mutate("StatefulSet", "UPDATE", scaled, "team-a", SETTINGS).obj
    assert updated["spec"]["template"]["metadata"]["annotations"]["trainhook.dev/replicas"] == "worker=6"
    pod = mutate("Pod", "CREATE", pod_of_statefulset(updated, 5), "team-a", SETTINGS).obj
    assert {"name": "WORLD_SIZE", "value": "6"} in pod["spec"]["containers"][0]["env"]


def test_api_server_defaults_are_replaced_with_a_warning():
    sts = copy.deepcopy(STS)
    sts["spec"]["podManagementPolicy"] = "OrderedReady"
    result = mutate("StatefulSet", "CREATE", sts, "team-a", SETTINGS)
    assert result.obj["spec"]["podManagementPolicy"] == "Parallel"
    assert "OrderedReady" in result.warnings[0]
    explicit = copy.deepcopy(STS)
    explicit["spec"]["podManagementPolicy"] = "Parallel"
    assert mutate("StatefulSet", "CREATE", explicit, "team-a", SETTINGS).warnings == []


def test_extra_tolerations_from_settings_are_added_once():
    toleration = {"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"}
    settings = Settings(extra_tolerations=(toleration,), toleration_namespaces=frozenset({"team-a"}))
    pod = pod_of_statefulset(GPU_STS, 0)
    added = mutate("Pod", "CREATE", pod, "team-a", settings).obj
    assert added["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}, toleration]
    pod["spec"]["tolerations"] = [dict(toleration)]
    out = mutate("Pod", "CREATE", pod, "team-a", settings).obj
    assert out["spec"]["tolerations"] == [
        toleration, {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_gang_wait_none_keeps_an_init_container_that_only_delivers_the_launcher():
    pod = pod_of_statefulset(with_annotation(STS_STAMPED, "trainhook.dev/gang-wait", "none"), 0)
    [init] = mutate("Pod", "CREATE", pod, "team-a", SETTINGS).obj["spec"]["initContainers"]
    assert init["command"] == ["trainhook-launch", "wait", "--install", "/trainhook"]
    assert {"name": "TRAINHOOK_GANG_WAIT", "value": "none"} in init["env"]


def test_gang_wait_none_without_the_delivered_launcher_injects_no_init_container():
    pod = pod_of_statefulset(with_annotation(with_annotation(STS_STAMPED, "trainhook.dev/gang-wait", "none"),
                                             "trainhook.dev/launcher", "none"), 0)
    spec = mutate("Pod", "CREATE", pod, "team-a", SETTINGS).obj["spec"]
    assert "initContainers" not in spec and "volumes" not in spec
    assert spec["containers"][0]["command"] == pod["spec"]["containers"][0]["command"]


@pytest.mark.parametrize("kind,obj", [(c[1], c[2]) for c in CASES] + [("Job", indexed_job("ij", 3))],
                         ids=[c[0] for c in CASES] + ["indexed job"])
def test_mutating_twice_equals_mutating_once(kind, obj):
    once = mutate(kind, "CREATE", obj, "team-a", SETTINGS)
    twice = mutate(kind, "CREATE", once.obj, "team-a", SETTINGS)
    assert twice.obj == once.obj
    assert twice.warnings == once.warnings or not once.warnings


NOTARY = Settings(gang_key=b"only-the-webhook-knows", notary_url="https://trainhook.trainhook.svc:8444",
                  notary_ca="-----BEGIN CERTIFICATE-----\nnot a secret\n-----END CERTIFICATE-----\n")
IDENTITY_VOLUME = {"name": "trainhook-identity", "projected": {"sources": [{"serviceAccountToken": {
    "audience": "trainhook", "expirationSeconds": 3600, "path": "token"}}]}}
IDENTITY_MOUNT = {"name": "trainhook-identity", "mountPath": "/var/run/secrets/trainhook.dev/identity",
                  "readOnly": True}


def test_a_delivered_launcher_gets_the_pods_identity_token_and_the_notary_but_no_key():
    pod = mutate("Pod", "CREATE", pod_of_statefulset(STS_STAMPED, 1), "team-a", NOTARY).obj
    spec = pod["spec"]
    training, init = spec["containers"][0], spec["initContainers"][0]
    assert IDENTITY_VOLUME in spec["volumes"]
    assert IDENTITY_MOUNT in training["volumeMounts"]
    assert all(m["name"] != "trainhook-identity" for m in init.get("volumeMounts") or [])  # the launcher's only
    env_of = {e["name"]: e.get("value") for e in training["env"]}
    assert env_of["TRAINHOOK_NOTARY"] == "https://trainhook.trainhook.svc:8444"
    assert env_of["TRAINHOOK_NOTARY_CA"] == NOTARY.notary_ca
    text = repr(pod)
    assert "TRAINHOOK_GANG_TOKEN" not in text
    import hashlib
    import hmac
    for message in (b"team-a/ddp", b"team-a/ddp/"):  # neither the old token nor anything keyed like it
        assert hmac.new(NOTARY.gang_key, message, hashlib.sha256).hexdigest() not in text
    assert "only-the-webhook-knows" not in text
    assert mutate("Pod", "CREATE", pod, "team-a", NOTARY).obj == pod  # idempotent


def test_a_gang_without_the_delivered_launcher_gets_no_identity():
    opted_out = pod_of_statefulset(with_annotation(STS_STAMPED, "trainhook.dev/launcher", "none"), 1)
    pod = mutate("Pod", "CREATE", opted_out, "team-a", NOTARY).obj
    assert "trainhook-identity" not in repr(pod) and "TRAINHOOK_NOTARY" not in repr(pod)
    # A webhook that runs no notary injects none of it either.
    plain = mutate("Pod", "CREATE", pod_of_statefulset(STS_STAMPED, 1), "team-a", SETTINGS).obj
    assert "trainhook-identity" not in repr(plain) and "TRAINHOOK_NOTARY" not in repr(plain)


@pytest.mark.parametrize("volume, mount, named", [
    ({"name": "trainhook-identity", "emptyDir": {}}, None, "spec.volumes"),
    ({"name": "mine", "emptyDir": {}}, {"name": "mine", "mountPath": "/var/run/secrets/trainhook.dev/identity/"},
     "volumeMounts"),
])
def test_a_users_volume_or_mount_in_the_identitys_place_is_refused_not_overwritten(volume, mount, named):
    pod = pod_of_statefulset(STS_STAMPED, 1)
    pod["spec"]["volumes"] = [volume]
    if mount:
        pod["spec"]["containers"][0]["volumeMounts"] = [mount]
    from trainhook.webhook.admission.member import Denied
    with pytest.raises(Denied) as denied:
        mutate("Pod", "CREATE", pod, "team-a", NOTARY)
    message = str(denied.value)
    assert named in message and "identity token" in message


def test_lifecycle_annotations_reach_the_launcher_as_variables():
    sts = with_annotation(STS_STAMPED, "trainhook.dev/on-failure", "restart-gang")
    sts = with_annotation(sts, "trainhook.dev/max-restarts", "2")
    sts = with_annotation(sts, "trainhook.dev/active-deadline-seconds", "3600")
    env_list = mutate("Pod", "CREATE", pod_of_statefulset(sts, 0), "team-a", SETTINGS).obj["spec"]["containers"][0]["env"]
    env = {e["name"]: e["value"] for e in env_list}
    assert (env["TRAINHOOK_ON_FAILURE"], env["TRAINHOOK_MAX_RESTARTS"], env["TRAINHOOK_ACTIVE_DEADLINE_SECONDS"],
            env["TRAINHOOK_WORKLOAD"], env["TRAINHOOK_RESTART_POLICY"]) == (
        "restart-gang", "2", "3600", "StatefulSet/ddp", "Always")
