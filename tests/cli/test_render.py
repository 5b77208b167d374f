"""`trainhook render`: labeled manifests from flags, valid for Kubernetes and wired by the webhook's own code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rendered import by_kind, options, validate_objects
from trainhook.gang import keys
from trainhook.cli import main
from trainhook.render.explain import explain_text
from trainhook.render import ACTIVE_DEADLINE_SECONDS, ON_FAILURE, RenderError, render, to_yaml

ROOT = Path(__file__).resolve().parents[2]


def env_of(explained, index: int) -> dict[str, str]:
    return dict(explained.pods[index].injected)


def test_a_single_role_gang_is_a_headless_service_and_a_statefulset():
    objects = render(options())
    validate_objects(objects)
    service, sts = objects
    assert service == {"apiVersion": "v1", "kind": "Service",
                       "metadata": {"name": "mnist", "labels": {keys.JOB_NAME: "mnist"}},
                       "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                                "selector": {keys.JOB_NAME: "mnist"}}}
    labels = {keys.FRAMEWORK: "pytorch", keys.JOB_NAME: "mnist", keys.ROLE: "worker"}
    assert sts == {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "mnist", "labels": labels},
        "spec": {"serviceName": "mnist", "replicas": 2, "podManagementPolicy": "Parallel",
                 "selector": {"matchLabels": {keys.JOB_NAME: "mnist", keys.ROLE: "worker"}},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "pytorch", "image": "example.com/train:1",
                                                       "command": ["torchrun", "/workspace/train.py"]}],
                                       "restartPolicy": "Always"}}}}


def test_a_multi_role_gang_is_one_indexed_job_per_role_named_job_role():
    objects = render(options(roles=[("worker", 3), ("master", 1)], kind="job", active_deadline_seconds=3600,
                             namespace="team-a"))
    validate_objects(objects)
    kinds = by_kind(objects)
    assert [j["metadata"]["name"] for j in kinds["Job"]] == ["mnist-master", "mnist-worker"]  # rank order
    for job, count in zip(kinds["Job"], (1, 3)):
        assert job["metadata"]["namespace"] == "team-a"
        assert job["metadata"]["annotations"][keys.REPLICAS] == "master=1,worker=3"
        assert job["metadata"]["annotations"][ACTIVE_DEADLINE_SECONDS] == "3600"
        spec = job["spec"]
        assert (spec["completions"], spec["parallelism"], spec["completionMode"]) == (count, count, "Indexed")
        assert (spec["backoffLimit"], spec["activeDeadlineSeconds"]) == (0, 3600)
        assert spec["template"]["spec"]["restartPolicy"] == "Never"


def test_every_rendered_pod_gets_the_environment_of_its_rank():
    text = to_yaml(render(options(roles=[("master", 1), ("worker", 3)], kind="job")))
    explained = explain_text(text)
    assert [env_of(explained, i)["RANK"] for i in range(4)] == ["0", "1", "2", "3"]
    for i in range(4):
        env = env_of(explained, i)
        assert env["WORLD_SIZE"] == "4"
        assert env["MASTER_ADDR"] == "mnist-master-0.mnist"
        assert env[keys.TH_JOB_NAME] == "mnist"
    assert explained.warnings == []


def test_resources_env_and_the_command_go_to_the_training_container():
    objects = render(options(gpus=2, cpu="4", memory="16Gi", env=[("EPOCHS", "3"), ("LR", "0.1")],
                             container="trainer"))
    validate_objects(objects)
    container = objects[1]["spec"]["template"]["spec"]["containers"][0]
    assert container == {"name": "trainer", "image": "example.com/train:1",
                         "command": ["torchrun", "/workspace/train.py"],
                         "env": [{"name": "EPOCHS", "value": "3"}, {"name": "LR", "value": "0.1"}],
                         "resources": {"requests": {"cpu": "4", "memory": "16Gi"},
                                       "limits": {"memory": "16Gi", keys.GPU_RESOURCE: 2}}}
    assert objects[1]["metadata"]["annotations"] == {keys.CONTAINER: "trainer"}
    env = env_of(explain_text(to_yaml(objects)), 0)
    assert env["PET_NPROC_PER_NODE"] == "2"


def test_the_gang_options_become_the_contracts_annotations():
    objects = render(options(elastic="1:3", on_failure="restart-gang", max_restarts=5, active_deadline_seconds=60,
                             nproc_per_node="2", port=29500, priority_class="high"))
    validate_objects(objects)
    assert objects[1]["metadata"]["annotations"] == {
        keys.ELASTIC: "1:3", ON_FAILURE: "restart-gang", keys.MAX_RESTARTS: "5", ACTIVE_DEADLINE_SECONDS: "60",
        keys.NPROC_PER_NODE: "2", keys.PORT: "29500"}
    # in the template itself: the API server's Priority plugin resolves the class before any webhook runs
    assert objects[1]["spec"]["template"]["spec"]["priorityClassName"] == "high"
    explained = explain_text(to_yaml(objects))
    env = env_of(explained, 1)
    assert (env["PET_NNODES"], env["PET_MAX_RESTARTS"], env["PET_NPROC_PER_NODE"], env["MASTER_PORT"]) == \
        ("1:3", "5", "2", "29500")
    # elastic: no WORLD_SIZE/RANK in the pod (the size changes as it runs; torchrun sets them for its workers)
    assert "WORLD_SIZE" not in env and "RANK" not in env
    assert explained.pods[1].pod["spec"]["priorityClassName"] == "high"


def test_an_mpi_gang_gets_its_launcher_and_workers_that_wait_for_it():
    objects = render(options(framework="mpi", roles=[("launcher", 1), ("worker", 2)],
                             command=["mpirun", "python", "/train.py"]))
    validate_objects(objects)
    launcher, worker = by_kind(objects)["StatefulSet"]
    # The manifests say what the user means; the webhook delivers the launcher and wraps the commands.
    assert launcher["spec"]["template"]["spec"]["containers"][0]["command"] == ["mpirun", "python", "/train.py"]
    assert "command" not in worker["spec"]["template"]["spec"]["containers"][0]
    assert worker["metadata"]["annotations"][keys.REPLICAS] == "launcher=1,worker=2"
    pods = explain_text(to_yaml(objects)).pods
    assert [p.pod["spec"]["containers"][0]["command"] for p in pods] == [
        ["/trainhook/bin/trainhook-launch", "mpirun", "--", "mpirun", "python", "/train.py"],
        ["/trainhook/bin/trainhook-launch", "mpi-worker"], ["/trainhook/bin/trainhook-launch", "mpi-worker"]]


@pytest.mark.parametrize("overrides, fragment", [
    ({"image": ""}, "--image is required"),
    ({"roles": []}, "--workers N, or --role ROLE=N"),
    ({"roles": [("ps", 1)]}, "'ps' is not a pytorch role"),
    ({"roles": [("worker", 0)]}, "at least one replica"),
    ({"cpu": "two"}, "--cpu two: not a Kubernetes quantity"),
    ({"gpus": -1}, "--gpus -1"),
    ({"elastic": "3:1"}, "--elastic 3:1: write MIN:MAX"),
    ({"elastic": "3:4"}, "the gang's 2 pods must lie within it"),
    ({"elastic": "1:2", "framework": "jax"}, "--elastic is PyTorch's"),
    ({"on_failure": "retry"}, "--on-failure retry"),
    ({"active_deadline_seconds": 0}, "--active-deadline-seconds 0"),
    ({"nproc_per_node": "many"}, "--nproc-per-node many"),
    ({"port": 70000}, "--port 70000"),
    ({"kind": "deployment"}, "--kind deployment"),
])
def test_options_that_cannot_work_are_refused_with_the_flag_and_the_fix(overrides, fragment):
    with pytest.raises(RenderError) as raised:
        render(options(**overrides))
    assert fragment in str(raised.value)


def test_the_cli_takes_the_command_after_double_dash(capsys):
    code = main(["render", "mnist", "--framework", "pytorch", "--role", "master=1", "--workers", "2",
                 "--image", "example.com/train:1", "--gpus", "1", "--env", "A=b=c", "-n", "team-a", "--",
                 "torchrun", "/workspace/train.py", "--lr", "0.1", "--", "x"])
    assert code == 0
    objects = list(yaml.safe_load_all(capsys.readouterr().out))
    validate_objects(objects)
    container = objects[1]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["torchrun", "/workspace/train.py", "--lr", "0.1", "--", "x"]
    assert container["env"] == [{"name": "A", "value": "b=c"}]
    assert [o["metadata"]["namespace"] for o in objects] == ["team-a"] * 3


def test_the_cli_takes_a_quoted_command_string(capsys):
    assert main(["render", "j", "--framework", "jax", "--workers", "2", "--image", "i", "--kind", "job",
                 "--command", "python3 train.py --msg 'hello world'"]) == 0
    job = list(yaml.safe_load_all(capsys.readouterr().out))[1]
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == ["python3", "train.py", "--msg",
                                                                          "hello world"]


@pytest.mark.parametrize("args, fragment", [
    (["--workers", "2"], "--image is required"),
    (["--workers", "2", "--image", "i", "--env", "1X=2"], "--env 1X=2"),
    (["--role", "master"], "--role master: write ROLE=COUNT"),
    # The --role flags are read as one shape by the gang model's parser (trainhook/gang/shape.py).
    (["--image", "i", "--role", "master=1", "--role", "worker=x"], "--role worker=x: write ROLE=COUNT"),
    (["--image", "i", "--role", "master=1", "--role", "master=2"], "--role master given twice"),
    (["--image", "i", "--role", "worker=0"], "the roles add up to no pod"),
    (["--image", "i", "--workers", "2", "--elastic", "3:2"], "--elastic 3:2: write MIN:MAX"),
    (["--image", "i", "--workers", "2", "--elastic", "3:4"], "the gang's 2 pods must lie within it"),
    (["--workers", "2", "--image", "i", "--queue", "q"], "--queue: give --gang-scheduler"),
    (["--workers", "2", "--image", "i", "--command", "a", "--", "b"], "either with --command or after --"),
])
def test_the_cli_reports_a_bad_flag_on_stderr_with_exit_2(capsys, args, fragment):
    assert main(["render", "mnist", *args]) == 2
    assert fragment in capsys.readouterr().err


def test_the_installed_console_script_renders_yaml_kubectl_can_read():
    result = subprocess.run([sys.executable, "-m", "trainhook.cli", "render", "ddp", "--workers", "4", "--image",
                             "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime", "--", "torchrun", "/ddp.py"],
                            capture_output=True, text=True, timeout=60, check=True)
    objects = list(yaml.safe_load_all(result.stdout))
    validate_objects(objects)
    assert json.dumps([o["kind"] for o in objects]) == '["Service", "StatefulSet"]'
