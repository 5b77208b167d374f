"""The Python SDK without a cluster: the manifests `TrainingClient` makes, and a shipped function that runs on
every rank of a real local gang (`trainhook local`: the real webhook, one network namespace per pod; root)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import trainhook
from rendered import validate_objects
from trainhook.gang import keys
from trainhook.render import to_yaml
from trainhook.sdk import TrainingClient, job_manifests
from trainhook.sdk.command import DELIMITER, function_command, function_script

ROOT = Path(__file__).resolve().parents[2]


def report_rank(args):
    """Shipped to every pod: says who it is, from the variables the webhook and torchrun set."""
    import os
    print(f"sdk-function rank={os.environ['RANK']} world={os.environ['WORLD_SIZE']} lr={args['lr']} "
          f"note={args['note']}", flush=True)


def report_process(args=None):
    import os
    print(f"sdk-function process={os.environ['PROCESS_ID']} of={os.environ['NUM_PROCESSES']}", flush=True)


def test_the_sdk_is_exported_lazily():
    code = "import sys, trainhook; print('trainhook.sdk' in sys.modules); trainhook.TrainingClient; " \
           "print('trainhook.sdk' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.split() == ["False", "True"]
    assert trainhook.TrainingClient is TrainingClient
    with pytest.raises(AttributeError):
        trainhook.NoSuchThing  # noqa: B018


def test_the_function_is_shipped_in_the_command_as_kubeflow_does():
    script = function_script(report_rank, {"lr": 0.1, "note": "it's $HOME"})
    assert script.startswith("import json\n\ndef report_rank(args):\n")
    call = 'report_rank(json.loads(\'{"lr": 0.1, "note": "it\\\'s $HOME"}\'))'
    assert script.endswith(f'if __name__ == "__main__":\n    {call}\n')
    command = function_command(report_rank, {"lr": 0.1, "note": "x"}, "pytorch", ["numpy==2.*", "a b"],
                               "https://pypi.example/simple")
    assert command[:2] == ["bash", "-c"]
    lines = command[2].splitlines()
    assert lines[0] == "set -e"
    assert lines[1] == ("PIP_DISABLE_PIP_VERSION_CHECK=1 python -m pip install --quiet --no-warn-script-location "
                        "--index-url https://pypi.example/simple 'numpy==2.*' 'a b'")
    assert lines[3] == f"cat > \"$program_path/ephemeral_script.py\" <<'{DELIMITER}'"  # quoted: nothing expands
    assert lines[-1] == 'exec torchrun "$program_path/ephemeral_script.py"'
    assert lines[-2].startswith("command -v torchrun >/dev/null 2>&1 || { echo \"command not found: torchrun ")
    assert function_command(report_process, None, "jax")[2].splitlines()[-1] == \
        'exec python "$program_path/ephemeral_script.py"'


@pytest.mark.parametrize("func, args, fragment", [
    (lambda: None, None, "defined with def"),
    (print, None, "cannot read the source of print"),
    (report_rank, [1, 2], "func_args must be a dict"),
])
def test_functions_that_cannot_be_shipped_are_refused(func, args, fragment):
    with pytest.raises(ValueError) as raised:
        function_script(func, args)
    assert fragment in str(raised.value)


def test_job_manifests_are_a_gang_with_kubeflows_resources_rule():
    objects = TrainingClient.job_manifests("mnist", func=report_rank, func_args={"lr": 1, "note": ""},
                                           num_workers=3, resources_per_worker={"cpu": "2", "memory": "4Gi", "gpu": 1},
                                           namespace="team-a", env={"EPOCHS": "2"})
    validate_objects(objects)
    sts = objects[1]
    assert (sts["kind"], sts["metadata"]["name"], sts["spec"]["replicas"]) == ("StatefulSet", "mnist", 3)
    container = sts["spec"]["template"]["spec"]["containers"][0]
    amounts = {"cpu": "2", "memory": "4Gi", keys.GPU_RESOURCE: 1}
    assert container["resources"] == {"requests": amounts, "limits": amounts}
    assert container["env"] == [{"name": "EPOCHS", "value": "2"}]
    assert container["image"] == "docker.io/pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"


def test_tensorflow_chief_and_ps_replicas_and_a_plain_command():
    objects = job_manifests("ps", command=["python", "train.py"], framework="tensorflow", num_workers=2,
                            num_chief_replicas=1, num_ps_replicas=1, kind="job", gang_scheduler="volcano",
                            queue="research", priority_class="high")
    validate_objects(objects)
    assert [o["metadata"]["name"] for o in objects] == ["ps", "ps-chief", "ps-ps", "ps-worker", "ps"]
    assert objects[-1]["spec"] == {"minMember": 4, "queue": "research", "priorityClassName": "high"}


def test_create_job_dry_run_needs_no_cluster_and_names_what_is_missing():
    client = TrainingClient(config_file="/nonexistent/kubeconfig")
    objects = client.create_job("mnist", train_func=report_rank, parameters={"lr": 1, "note": ""}, dry_run=True)
    assert objects == job_manifests("mnist", func=report_rank, func_args={"lr": 1, "note": ""})
    with pytest.raises(ValueError, match="give func= \\(a function to run on every pod\\), command="):
        client.create_job("mnist", dry_run=True)
    with pytest.raises(ValueError, match="needs a name"):
        client.create_job(func=report_rank, dry_run=True)


def run_local(tmp_path: Path, objects: list[dict]) -> str:
    manifest = tmp_path / "gang.yaml"
    manifest.write_text(to_yaml(objects))
    result = subprocess.run([sys.executable, "-m", "trainhook.local.cli", str(manifest), "--timeout", "240"],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_a_shipped_function_runs_on_every_rank_under_torchrun(tmp_path):
    objects = job_manifests("fn", func=report_rank, func_args={"lr": 0.5, "note": "it's $HOME"}, num_workers=3,
                            kind="job")
    out = run_local(tmp_path, objects)
    ran = re.findall(r"^\[fn-(\d)-\w+\] sdk-function rank=(\d) world=(\d) lr=0.5 note=it's \$HOME$", out, re.M)
    assert sorted(ran) == [("0", "0", "3"), ("1", "1", "3"), ("2", "2", "3")]  # pod index == rank, on every pod


def test_a_shipped_function_runs_on_every_process_under_python(tmp_path):
    objects = job_manifests("jx", func=report_process, framework="jax", num_workers=2, kind="job")
    out = run_local(tmp_path, objects)
    ran = re.findall(r"^\[jx-(\d)-\w+\] sdk-function process=(\d) of=2$", out, re.M)
    assert sorted(ran) == [("0", "0"), ("1", "1")]


def test_the_docs_job_manifests_example_runs_and_its_function_takes_what_it_is_given(tmp_path):
    """docs/use/sdk.md's offline example, run as the reader runs it (a file, python); then the program it ships to
    the pods, run here with a rank's variables: the call must match the function's signature."""
    import yaml

    text = (ROOT / "docs" / "use" / "sdk.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "job_manifests(" in b]
    (tmp_path / "example.py").write_text(block)
    result = subprocess.run([sys.executable, str(tmp_path / "example.py")], capture_output=True, text=True,
                            timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    objects = [d for d in yaml.safe_load_all(result.stdout) if d]
    validate_objects(objects)
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [("Service", "mnist"), ("Job", "mnist")]
    script = objects[1]["spec"]["template"]["spec"]["containers"][0]["command"][2]
    program = script.split(f"<<'{DELIMITER}'\n", 1)[1].split(f"\n{DELIMITER}\n", 1)[0]
    (tmp_path / "program.py").write_text(program)
    ran = subprocess.run([sys.executable, str(tmp_path / "program.py")], capture_output=True, text=True, timeout=60,
                         env={"RANK": "1", "PATH": "/usr/bin:/bin"})
    assert (ran.returncode, ran.stdout) == (0, "rank 1 lr 0.1\n"), ran.stderr
