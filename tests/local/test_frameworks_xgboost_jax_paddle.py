"""XGBoost, JAX, PaddlePaddle (and MXNet's variables): the injected environment and real trainings.

Three groups of tests:
- whole-object mutation cases, table-driven like tests/webhook/test_mutation_pytorch.py;
- the environment against Kubeflow's for the same shape, variable by variable, with Kubeflow's values as golden
  data transcribed from kubeflow/training-operator (v1.8/1.9; each table cites its source) and every
  difference listed, with its reason, in KUBEFLOW_DIFFERENCES and RENDEZVOUS_HOST_DIFFERENCES;
- the examples trained for real with `trainhook local`: every pod in its own network namespace, addressed by
  name, the real webhook injecting the variables.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from expected import gang_env, stamped, wired
from helpers import local_summary
from objects import bare_pod, container, indexed_job, pod_of_job, pod_of_statefulset, statefulset
from webhook_process import free_port

from trainhook.webhook.admission.member import Denied
from trainhook.webhook.admission.mutate import mutate
from trainhook.webhook.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SETTINGS = Settings(launcher_image="registry.example/launcher:1", wait_timeout=300)


# --- Builders for the expected objects -----------------------------------------------------------------------

def labels(framework: str, **more: str) -> dict:
    return {"trainhook.dev/framework": framework, **{f"trainhook.dev/{k.replace('_', '-')}": v
                                                     for k, v in more.items()}}


def role_pod(framework: str, job: str, shape: str, role: str, index: int, **annotations: str) -> dict:
    """Pod `index` of StatefulSet `<job>-<role>` in a multi-role gang (Kubeflow's pod names)."""
    sts = statefulset(f"{job}-{role}", int(dict(p.split("=") for p in shape.split(","))[role]),
                      labels=labels(framework, job_name=job, role=role),
                      annotations={"trainhook.dev/replicas": shape}, service=job)
    sts = stamped(sts, shape, role=role, job=job)
    sts["spec"]["template"]["metadata"]["annotations"].update(annotations)
    return pod_of_statefulset(sts, index)


def single_pod(framework: str, name: str, replicas: int, index: int, **template_kwargs) -> dict:
    sts = stamped(statefulset(name, replicas, labels=labels(framework), **template_kwargs), f"worker={replicas}")
    return pod_of_statefulset(sts, index)


def admitted(pod: dict) -> dict:
    return mutate("Pod", "CREATE", pod, "team-a", SETTINGS).obj


def injected(pod: dict) -> dict[str, str]:
    """The training container's variables after admission, without the TRAINHOOK_* ones."""
    return {e["name"]: e["value"] for e in admitted(pod)["spec"]["containers"][0]["env"]
            if not e["name"].startswith("TRAINHOOK_")}


# --- Whole-object cases --------------------------------------------------------------------------------------

XGB_SHAPE = "master=1,worker=2"
XGB_HOSTS = "master=xgb-master,worker=xgb-worker"
XGB_WORKER_1 = role_pod("xgboost", "xgb", XGB_SHAPE, "worker", 1)
XGB_SINGLE_0 = single_pod("xgboost", "boost", 3, 0)
XGB_PORT = role_pod("xgboost", "xgb", XGB_SHAPE, "master", 0, **{"trainhook.dev/port": "12345"})
JAX_1 = single_pod("jax", "jx", 2, 1)
JAX_JOB = stamped(indexed_job("jj", 3, labels=labels("jax")), "worker=3")
JAX_JOB_2 = pod_of_job(JAX_JOB, 2)
PADDLE_0 = single_pod("paddle", "pp", 2, 0)
PADDLE_1 = single_pod("paddle", "pp", 2, 1)
PS_SHAPE = "master=1,worker=2"
PS_HOSTS = "master=ps-master,worker=ps-worker"
PS_MASTER_0 = role_pod("paddle", "ps", PS_SHAPE, "master", 0)
PS_WORKER_0 = role_pod("paddle", "ps", PS_SHAPE, "worker", 0)
USER_MASTER = [{"name": "PADDLE_MASTER", "value": "rendezvous.example:4000"}]
PADDLE_USER = single_pod("paddle", "own", 2, 1, containers=[container(env=USER_MASTER)])
MX_SHAPE = "scheduler=1,server=2,worker=2"
MX_BARE_WORKER = bare_pod("mx-worker-1", labels(
    "mxnet", job_name="mx", role="worker", index="1"), {"trainhook.dev/replicas": MX_SHAPE})
MX_CONFIG = ('{"cluster":{"scheduler":[{"url":"mx-scheduler-0.mx","port":9091}],'
             '"server":[{"url":"mx-server-0.mx","port":9091},{"url":"mx-server-1.mx","port":9091}],'
             '"worker":[{"url":"mx-worker-0.mx","port":9091},{"url":"mx-worker-1.mx","port":9091}]},'
             '"labels":{"scheduler":"","server":"","worker":""},"task":{"type":"worker","index":1}}')


def xgb_env(master: str, world: int, rank: int, others: str, port: str = "9999") -> dict:
    return dict(MASTER_PORT=port, MASTER_ADDR=master, WORLD_SIZE=str(world), RANK=str(rank), PYTHONUNBUFFERED="1",
                WORKER_PORT=port, WORKER_ADDRS=others, DMLC_TRACKER_URI=master, DMLC_TRACKER_PORT=port,
                DMLC_TASK_ID=str(rank), DMLC_NUM_WORKER=str(world))


def jax_env(coordinator: str, processes: int, process_id: int) -> dict:
    return dict(PYTHONUNBUFFERED="1", COORDINATOR_PORT="6666", COORDINATOR_ADDRESS=coordinator,
                NUM_PROCESSES=str(processes), PROCESS_ID=str(process_id),
                JAX_COORDINATOR_ADDRESS=f"{coordinator}:6666", JAX_NUM_PROCESSES=str(processes),
                JAX_PROCESS_ID=str(process_id))


def paddle_env(job: str, nodes: int, master: str, **ps: str) -> dict:
    return dict(PYTHONUNBUFFERED="1", PADDLE_JOB_ID=job, PADDLE_NNODES=str(nodes), PADDLE_MASTER=master, **ps)


CASES = [
    ("xgboost: a worker of a master+worker gang ranks after the master and knows every address", XGB_WORKER_1,
     wired(XGB_WORKER_1, xgb_env("xgb-master-0.xgb", 3, 2, "xgb-worker-0.xgb,xgb-worker-1.xgb"),
           gang_env("xgboost", "xgb", "worker", 1, 2, XGB_SHAPE, XGB_HOSTS, "xgb", "xgb-worker-1.xgb"))),
    ("xgboost: in a single-role gang pod 0 is the master and the tracker", XGB_SINGLE_0,
     wired(XGB_SINGLE_0, xgb_env("boost-0.boost", 3, 0, "boost-1.boost,boost-2.boost"),
           gang_env("xgboost", "boost", "worker", 0, 0, "worker=3", "worker=boost", "boost", "boost-0.boost"))),
    ("xgboost: the port annotation moves the master, worker and tracker ports together", XGB_PORT,
     wired(XGB_PORT, xgb_env("xgb-master-0.xgb", 3, 0, "xgb-worker-0.xgb,xgb-worker-1.xgb", port="12345"),
           gang_env("xgboost", "xgb", "master", 0, 0, XGB_SHAPE, XGB_HOSTS, "xgb", "xgb-master-0.xgb",
                    port="12345"))),
    ("jax: a StatefulSet pod's process id is its ordinal; process 0 coordinates", JAX_1,
     wired(JAX_1, jax_env("jx-0.jx", 2, 1),
           gang_env("jax", "jx", "worker", 1, 1, "worker=2", "worker=jx", "jx", "jx-1.jx"))),
    ("jax: an Indexed Job pod's process id is its completion index", JAX_JOB_2,
     wired(JAX_JOB_2, jax_env("jj-0.jj", 3, 2),
           gang_env("jax", "jj", "worker", 2, 2, "worker=3", "worker=jj", "jj", "jj-2.jj"),
           hostname="jj-2", subdomain="jj")),
    ("paddle: the collective rendezvous host names itself 127.0.0.1", PADDLE_0,
     wired(PADDLE_0, paddle_env("pp", 2, "127.0.0.1:36543"),
           gang_env("paddle", "pp", "worker", 0, 0, "worker=2", "worker=pp", "pp", "pp-0.pp"))),
    ("paddle: the other collective pods dial worker 0 by name", PADDLE_1,
     wired(PADDLE_1, paddle_env("pp", 2, "pp-0.pp:36543"),
           gang_env("paddle", "pp", "worker", 1, 1, "worker=2", "worker=pp", "pp", "pp-1.pp"))),
    ("paddle: with a master the gang runs in PS mode and master 0 hosts the rendezvous", PS_MASTER_0,
     wired(PS_MASTER_0, paddle_env("ps", 3, "127.0.0.1:36543", PADDLE_SERVER_NUM="1"),
           gang_env("paddle", "ps", "master", 0, 0, PS_SHAPE, PS_HOSTS, "ps", "ps-master-0.ps"))),
    ("paddle: a PS-mode worker 0 dials the master and counts one trainer", PS_WORKER_0,
     wired(PS_WORKER_0, paddle_env("ps", 3, "ps-master-0.ps:36543", PADDLE_TRAINER_NUM="1"),
           gang_env("paddle", "ps", "worker", 0, 1, PS_SHAPE, PS_HOSTS, "ps", "ps-worker-0.ps"))),
    ("paddle: the user's PADDLE_MASTER is kept, after the injected variables", PADDLE_USER,
     wired(PADDLE_USER, {k: v for k, v in paddle_env("own", 2, "").items() if k != "PADDLE_MASTER"},
           gang_env("paddle", "own", "worker", 1, 1, "worker=2", "worker=own", "own", "own-1.own"),
           user_env=USER_MASTER)),
    ("mxnet: a bare worker gets MX_CONFIG, the scheduler and its DMLC_WORKER_ID", MX_BARE_WORKER,
     wired(MX_BARE_WORKER, dict(MX_CONFIG=MX_CONFIG, DMLC_PS_ROOT_PORT="9091", DMLC_PS_ROOT_URI="mx-scheduler-0.mx",
                                DMLC_NUM_SERVER="2", DMLC_NUM_WORKER="2", DMLC_ROLE="worker", DMLC_USE_KUBERNETES="1",
                                DMLC_WORKER_ID="1"),
           gang_env("mxnet", "mx", "worker", 1, 4, MX_SHAPE, "scheduler=mx-scheduler,server=mx-server,worker=mx-worker",
                    "mx", "mx-worker-1.mx"), hostname="mx-worker-1", subdomain="mx")),
]


@pytest.mark.parametrize("name,given,expected", CASES, ids=[c[0] for c in CASES])
def test_mutation_yields_the_whole_expected_pod(name, given, expected):
    before = copy.deepcopy(given)
    assert admitted(given) == expected
    assert given == before, "the input object must not be modified"


@pytest.mark.parametrize("given", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_mutating_twice_equals_mutating_once(given):
    once = mutate("Pod", "CREATE", given, "team-a", SETTINGS)
    twice = mutate("Pod", "CREATE", once.obj, "team-a", SETTINGS)
    assert twice.obj == once.obj


def test_a_kept_paddle_master_is_reported_as_a_warning():
    result = mutate("Pod", "CREATE", PADDLE_USER, "team-a", SETTINGS)
    assert result.warnings == ["container trainer: kept your PADDLE_MASTER=rendezvous.example:4000; "
                               "trainhook would set own-0.own:36543"]


@pytest.mark.parametrize("framework,why", [("xgboost", "an XGBoost gang has at most one master (it runs the tracker)"),
                                           ("paddle", "a PaddlePaddle gang has at most one master (the rendezvous)")])
def test_a_gang_with_two_masters_is_refused_at_apply_and_at_pod_admission(framework, why):
    problem = (f"trainhook.dev/replicas='master=2,worker=1': {why}; "
               "set master=1 and put the other replicas in the worker role")
    workers = statefulset("two-worker", 1, labels=labels(framework, job_name="two", role="worker"),
                          annotations={"trainhook.dev/replicas": "master=2,worker=1"}, service="two")
    with pytest.raises(Denied) as denied:
        mutate("StatefulSet", "CREATE", workers, "team-a", SETTINGS)
    assert denied.value.problems == [problem]
    with pytest.raises(Denied) as denied:
        mutate("Pod", "CREATE", role_pod(framework, "two", "master=2,worker=1", "worker", 0), "team-a", SETTINGS)
    assert denied.value.problems == [problem]


def test_mxnet_without_a_scheduler_gets_kubeflows_empty_root_and_no_worker_id_off_the_worker_role():
    server = bare_pod("solo-server-0", labels("mxnet", job_name="solo", role="server", index="0"),
                      {"trainhook.dev/replicas": "server=1,worker=1"})
    got = injected(server)
    assert (got["DMLC_PS_ROOT_URI"], got["DMLC_PS_ROOT_PORT"], got["DMLC_ROLE"]) == ("", "0", "server")
    assert "DMLC_WORKER_ID" not in got
    assert json.loads(got["MX_CONFIG"])["task"] == {"type": "server", "index": 0}


# --- Against Kubeflow, variable by variable ------------------------------------------------------------------
# Each golden case: (framework, Kubeflow job name, replica counts, role, index, Kubeflow's variables). Addresses
# in Kubeflow's values are its per-replica Service names `<job>-<role>-<i>`; ours are `<job>-<role>-<i>.<job>`
# (the shared headless Service), which `ours()` rewrites before comparing. The trainhook gang is built the
# contract's way: one StatefulSet per role named `<job>-<role>` sharing the Service `<job>`.

def xgb_golden(rank: int, world: int, workers: list[str]) -> dict:
    env = {"MASTER_PORT": "9999", "MASTER_ADDR": "test-xgboostjob-master-0", "WORLD_SIZE": str(world),
           "RANK": str(rank), "PYTHONUNBUFFERED": "0"}
    if workers:
        env.update(WORKER_PORT="9999", WORKER_ADDRS=",".join(workers))
    return env


XGB_WORKERS = ["test-xgboostjob-worker-0", "test-xgboostjob-worker-1"]
MX_JOB = {"scheduler": 1, "server": 1, "worker": 2}


def mx_golden(role: str, index: int) -> dict:
    cluster = ",".join(f'"{r}":[' + ",".join(f'{{"url":"test-mxjob-{r}-{i}","port":9091}}' for i in range(n)) + "]"
                       for r, n in sorted(MX_JOB.items()))
    env = {"MX_CONFIG": '{"cluster":{' + cluster + '},"labels":{"scheduler":"","server":"","worker":""},'
                        f'"task":{{"type":"{role}","index":{index}}}}}',
           "DMLC_PS_ROOT_PORT": "9091", "DMLC_PS_ROOT_URI": "test-mxjob-scheduler-0", "DMLC_NUM_SERVER": "1",
           "DMLC_NUM_WORKER": "2", "DMLC_ROLE": role, "DMLC_USE_KUBERNETES": "1"}
    if role == "worker":
        env["DMLC_WORKER_ID"] = str(index)
    return env


GOLDEN = [
    # pkg/controller.v1/xgboost/pod_test.go TestClusterSpec: NewXGBoostJobWithMaster(0) and (2), i.e. master=1
    # plus 0 or 2 workers; PYTHONUNBUFFERED=0 is from xgboost.go SetPodEnv, which that test does not check.
    ("xgboost", "test-xgboostjob", {"master": 1}, "master", 0, xgb_golden(0, 1, [])),
    ("xgboost", "test-xgboostjob", {"master": 1, "worker": 2}, "master", 0, xgb_golden(0, 3, XGB_WORKERS)),
    ("xgboost", "test-xgboostjob", {"master": 1, "worker": 2}, "worker", 0, xgb_golden(1, 3, XGB_WORKERS)),
    ("xgboost", "test-xgboostjob", {"master": 1, "worker": 2}, "worker", 1, xgb_golden(2, 3, XGB_WORKERS)),
    # pkg/controller.v1/jax/envvar_test.go TestSetPodEnv "successful environment variable setup" (worker=1),
    # and the same setPodEnv (envvar.go) for worker 2 of 3.
    ("jax", "test-jaxjob", {"worker": 1}, "worker", 0,
     {"PYTHONUNBUFFERED": "1", "COORDINATOR_PORT": "6666", "COORDINATOR_ADDRESS": "test-jaxjob-worker-0",
      "NUM_PROCESSES": "1", "PROCESS_ID": "0"}),
    ("jax", "test-jaxjob", {"worker": 3}, "worker", 2,
     {"PYTHONUNBUFFERED": "1", "COORDINATOR_PORT": "6666", "COORDINATOR_ADDRESS": "test-jaxjob-worker-0",
      "NUM_PROCESSES": "3", "PROCESS_ID": "2"}),
    # pkg/controller.v1/paddlepaddle/envvar.go setPodEnv, collective mode (no master) and PS mode; the
    # controller test (paddlepaddle_controller_test.go) checks the master's PADDLE_MASTER=$(POD_IP_DUMMY):<port>.
    ("paddle", "test-job", {"worker": 2}, "worker", 0,
     {"PYTHONUNBUFFERED": "0", "PADDLE_JOB_ID": "test-job", "PADDLE_NNODES": "2", "POD_IP_DUMMY": "(status.podIP)",
      "PADDLE_MASTER": "$(POD_IP_DUMMY):36543"}),
    ("paddle", "test-job", {"worker": 2}, "worker", 1,
     {"PYTHONUNBUFFERED": "0", "PADDLE_JOB_ID": "test-job", "PADDLE_NNODES": "2",
      "PADDLE_MASTER": "test-job-worker-0:36543"}),
    ("paddle", "test-job", {"master": 1, "worker": 2}, "master", 0,
     {"PYTHONUNBUFFERED": "0", "PADDLE_JOB_ID": "test-job", "PADDLE_NNODES": "3", "POD_IP_DUMMY": "(status.podIP)",
      "PADDLE_MASTER": "$(POD_IP_DUMMY):36543", "PADDLE_SERVER_NUM": "1"}),
    ("paddle", "test-job", {"master": 1, "worker": 2}, "worker", 0,
     {"PYTHONUNBUFFERED": "0", "PADDLE_JOB_ID": "test-job", "PADDLE_NNODES": "3",
      "PADDLE_MASTER": "test-job-master-0:36543", "PADDLE_TRAINER_NUM": "1"}),
    # pkg/controller.v1/mxnet/mxnet.go SetPodEnv (MX_CONFIG marshalled by Go: map keys sorted), and
    # pod_test.go TestBytPSEnv for DMLC_WORKER_ID (the index on workers, absent elsewhere).
    ("mxnet", "test-mxjob", MX_JOB, "scheduler", 0, mx_golden("scheduler", 0)),
    ("mxnet", "test-mxjob", MX_JOB, "server", 0, mx_golden("server", 0)),
    ("mxnet", "test-mxjob", MX_JOB, "worker", 1, mx_golden("worker", 1)),
]

# Every way the injected environment differs from Kubeflow's for the same shape, and why:
# (framework, variable) -> our value, or None where we do not set it.
KUBEFLOW_DIFFERENCES = {
    # CPython turns unbuffered output on for any non-empty PYTHONUNBUFFERED, "0" included; "1" says so.
    ("xgboost", "PYTHONUNBUFFERED"): "1",
    ("paddle", "PYTHONUNBUFFERED"): "1",
}
# The same, only on the pod hosting Paddle's rendezvous (the pods Kubeflow gives POD_IP_DUMMY): Kubeflow hands it
# its pod IP through the downward API; the webhook's variables are plain values, so it gets 127.0.0.1, the other
# host Paddle's launcher recognises as itself.
RENDEZVOUS_HOST_DIFFERENCES = {
    ("paddle", "POD_IP_DUMMY"): None,
    ("paddle", "PADDLE_MASTER"): "127.0.0.1:36543",
}
# What trainhook adds on top of Kubeflow's variables (contract section 4).
EXTRAS = {"xgboost": {"DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_TASK_ID", "DMLC_NUM_WORKER"},
          "jax": {"JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"},
          "paddle": set(), "mxnet": set()}


def ours(value: str, job: str) -> str:
    """A Kubeflow value with its Service names `<job>-<role>-<i>` written as trainhook's pod addresses."""
    return re.sub(rf"\b({re.escape(job)}-[a-z]+-\d+)\b", rf"\1.{job}", value)


def trainhook_pod(framework: str, job: str, counts: dict, role: str, index: int) -> dict:
    return role_pod(framework, job, ",".join(f"{r}={n}" for r, n in counts.items()), role, index)


def kubeflow_differences(framework: str, kubeflow: dict) -> dict:
    hosts_rendezvous = "POD_IP_DUMMY" in kubeflow
    return {name: table[framework, name]
            for table in (KUBEFLOW_DIFFERENCES, RENDEZVOUS_HOST_DIFFERENCES if hosts_rendezvous else {})
            for name in kubeflow if (framework, name) in table}


@pytest.mark.parametrize("framework,job,counts,role,index,kubeflow", GOLDEN,
                         ids=[f"{g[0]} {','.join(f'{r}={n}' for r, n in g[2].items())} {g[3]}-{g[4]}" for g in GOLDEN])
def test_the_environment_is_kubeflows_variable_by_variable(framework, job, counts, role, index, kubeflow):
    got = injected(trainhook_pod(framework, job, counts, role, index))
    differences = kubeflow_differences(framework, kubeflow)
    for name, value in kubeflow.items():
        expected = differences[name] if name in differences else ours(value, job)
        assert got.get(name) == expected, f"{name}: Kubeflow sets {value!r}"
    assert set(got) - set(kubeflow) == EXTRAS[framework]


def test_every_listed_difference_from_kubeflow_still_exists():
    """The difference tables must not outlive a difference: each entry is met by a golden case, and there our
    value really is not Kubeflow's."""
    met = set()
    for framework, job, counts, role, index, kubeflow in GOLDEN:
        got = injected(trainhook_pod(framework, job, counts, role, index))
        for name in kubeflow_differences(framework, kubeflow):
            met.add((framework, name))
            assert got.get(name) != ours(kubeflow[name], job)
    assert met == set(KUBEFLOW_DIFFERENCES) | set(RENDEZVOUS_HOST_DIFFERENCES)


def test_the_extras_carry_the_same_values_as_kubeflows_variables():
    xgb = injected(trainhook_pod("xgboost", "j", {"master": 1, "worker": 3}, "worker", 2))
    assert (xgb["DMLC_TRACKER_URI"], xgb["DMLC_TRACKER_PORT"], xgb["DMLC_TASK_ID"], xgb["DMLC_NUM_WORKER"]) == (
        xgb["MASTER_ADDR"], xgb["MASTER_PORT"], xgb["RANK"], xgb["WORLD_SIZE"])
    jx = injected(trainhook_pod("jax", "j", {"worker": 4}, "worker", 3))
    assert (jx["JAX_COORDINATOR_ADDRESS"], jx["JAX_NUM_PROCESSES"], jx["JAX_PROCESS_ID"]) == (
        f"{jx['COORDINATOR_ADDRESS']}:{jx['COORDINATOR_PORT']}", jx["NUM_PROCESSES"], jx["PROCESS_ID"])


# --- The examples --------------------------------------------------------------------------------------------

EXAMPLE_SCRIPTS = [("xgboost", "xgboost_dist"), ("jax", "allgather"), ("paddle", "collective")]


@pytest.mark.parametrize("folder,name", EXAMPLE_SCRIPTS)
def test_the_manifests_configmap_carries_the_script_verbatim(folder, name):
    docs = list(yaml.safe_load_all((EXAMPLES / folder / f"{name}.yaml").read_text()))
    [configmap] = [d for d in docs if d["kind"] == "ConfigMap"]
    assert configmap["data"] == {f"{name}.py": (EXAMPLES / folder / f"{name}.py").read_text()}


def local(manifest: Path, workdir: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """`trainhook local MANIFEST`. The local pods run this interpreter's environment, so the framework must be
    installed in it: checked first, so a missing install fails here rather than letting the example's install
    fallback run pip inside the pods."""
    framework = manifest.parent.name
    assert importlib.util.find_spec(framework), f"{framework} is not installed in {sys.executable}"
    return subprocess.run([sys.executable, "-m", "trainhook.local.cli", str(manifest), "--timeout", str(timeout),
                           "--workdir", str(workdir)], capture_output=True, text=True, timeout=timeout + 60,
                          cwd=ROOT)


def summary(stdout: str) -> dict[str, tuple[str, str, str]]:
    """POD -> (RANK, EXIT, STATUS) from the run's closing table."""
    return {pod: (cells[0], cells[1], cells[3]) for pod, cells in local_summary(stdout).items()}


def mutated_env(workdir: Path) -> dict[str, dict[str, str]]:
    """The training container's variables of every pod as the webhook admitted it (the run's pods.yaml)."""
    pods = yaml.safe_load_all((workdir / "pods.yaml").read_text())
    return {p["metadata"]["name"]: {e["name"]: e.get("value") for e in p["spec"]["containers"][0]["env"]}
            for p in pods}


def test_xgboost_trains_across_local_pods_and_every_worker_ends_with_the_same_model(tmp_path):
    result = local(EXAMPLES / "xgboost" / "xgboost_dist.yaml", tmp_path / "run")
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-2000:]
    # StatefulSets: the delivered launchers park once the master is done, so nothing trains twice.
    assert summary(out) == {"xgb-master-0": ("0", "0", "Succeeded"), "xgb-worker-0": ("1", "0", "Succeeded"),
                            "xgb-worker-1": ("2", "0", "Succeeded")}
    for pod, rank in (("xgb-master-0", 0), ("xgb-worker-0", 1), ("xgb-worker-1", 2)):
        assert out.count(f"[{pod}] rank {rank}/3 on {pod}: 2000 of 6000 rows") == 1
    digests = re.findall(r"^\[(xgb-\w+-\d)\] final model digest (\w+) identical-across-workers=True$", out, re.M)
    assert sorted(pod for pod, _ in digests) == ["xgb-master-0", "xgb-worker-0", "xgb-worker-1"]
    assert len({digest for _, digest in digests}) == 1
    assert re.search(r"^\[xgb-master-0\] \[[\d:]+\] \[19\]\ttrain-rmse:0\.\d+$", out, re.M)
    env = mutated_env(tmp_path / "run")
    assert env["xgb-worker-1"]["DMLC_TRACKER_URI"] == "xgb-master-0.xgb"
    assert env["xgb-worker-1"]["WORKER_ADDRS"] == "xgb-worker-0.xgb,xgb-worker-1.xgb"



def test_the_xgboost_example_also_runs_on_kubeflows_variables_alone(tmp_path):
    """Under an XGBoostJob only MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE exist: the script derives the rest."""
    port = str(free_port())
    script = str(EXAMPLES / "xgboost" / "xgboost_dist.py")
    procs = [subprocess.Popen([sys.executable, script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={"PATH": "/usr/bin:/bin", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                                   "RANK": str(rank), "WORLD_SIZE": "2", "ROUNDS": "5", "OMP_NUM_THREADS": "1"})
             for rank in range(2)]
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    digests = {re.search(r"final model digest (\w+) identical-across-workers=True", o)[1] for o in outputs}
    assert len(digests) == 1


def test_jax_processes_in_local_pods_agree_on_an_allgather(tmp_path):
    result = local(EXAMPLES / "jax" / "allgather.yaml", tmp_path / "run")
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-2000:]
    assert summary(out) == {"jax-0": ("0", "0", "Succeeded"), "jax-1": ("1", "0", "Succeeded")}
    for pod in ("jax-0", "jax-1"):
        assert f"[{pod}] process {pod[-1]}/2 on {pod}: 1 local of 2 devices" in out
        assert f"[{pod}] allgather [[0, 0, 100], [1, 1, 101]] sum 203 agrees=True" in out
    assert mutated_env(tmp_path / "run")["jax-1"]["JAX_COORDINATOR_ADDRESS"] == "jax-0.jax:6666"


def test_paddle_trains_across_two_local_pods_with_identical_parameters(tmp_path):
    result = local(EXAMPLES / "paddle" / "collective.yaml", tmp_path / "run")
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-2000:]
    assert summary(out) == {"paddle-0": ("0", "0", "Succeeded"), "paddle-1": ("1", "0", "Succeeded")}
    # Paddle's launcher numbers its trainers itself; both pods train, and one of them is its rank 0.
    assert sorted(re.findall(r"^\[paddle-[01]\] rank (\d)/2 on paddle-[01]: training$", out, re.M)) == ["0", "1"]
    assert re.search(r"^\[paddle-[01]\] epoch 3 loss \d+\.\d{4}$", out, re.M)
    digests = re.findall(r"^\[(paddle-[01])\] final parameters digest (\w+) identical-across-ranks=True$", out, re.M)
    assert sorted(pod for pod, _ in digests) == ["paddle-0", "paddle-1"]
    assert len({digest for _, digest in digests}) == 1
    env = mutated_env(tmp_path / "run")
    assert (env["paddle-0"]["PADDLE_MASTER"], env["paddle-1"]["PADDLE_MASTER"]) == (
        "127.0.0.1:36543", "paddle-0.paddle:36543")
    # paddle-1's launcher reached the rendezvous that paddle-0's launcher started.
    assert "master: paddle-0.paddle:36543" in (tmp_path / "run/logs/paddle-1/paddle.log").read_text()
