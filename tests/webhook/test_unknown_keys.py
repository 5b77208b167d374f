"""No silent typos (issue 25 item 3): a trainhook.dev/ key trainhook never reads where it is written is told.

The webhook warns (over real HTTPS, as kubectl prints admission warnings) on every object it admits, naming the
nearest known key; the CLI's tools refuse, through their real parser and main: `explain` and `trainhook local`
(including the keys the webhook's objectSelector never lets it see), `convert`, and render's gang_objects (the SDK).
One list of known keys, keys.known_keys(), serves them all.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from objects import bare_pod, pod_of_statefulset, service, statefulset
from test_server_https import admitted
from trainhook.gang import keys
from trainhook.cli import main
from trainhook.render import Gang, RenderError, gang_objects

ROOT = Path(__file__).resolve().parents[2]
DDP = ROOT / "examples" / "pytorch" / "ddp.yaml"


def test_every_key_of_the_keys_module_and_of_the_contract_is_known_where_the_contract_places_it():
    labels, annotations = keys.known_keys()
    constants = {value for name, value in vars(keys).items() if name.isupper() and isinstance(value, str)
                 and value.startswith(keys.PREFIX) and value != keys.PREFIX}
    assert constants == labels | annotations
    assert labels == {keys.FRAMEWORK, keys.JOB_NAME, keys.ROLE, keys.INDEX, keys.PHASE}
    assert keys.PHASE in annotations and keys.REPLICAS in annotations and keys.FRAMEWORK not in annotations
    table = (ROOT / "docs" / "use" / "contract.md").read_text().split("## 2. Keys")[1].split("## 3.")[0]
    rows = re.findall(r"^\| `([a-z-]+)` \| (label|annotation) \|", table, re.M)
    assert len(rows) > 20
    for name, place in rows:
        assert keys.PREFIX + name in (labels if place == "label" else annotations), name


@pytest.mark.parametrize("labels, annotations, expected", [
    ({"trainhook.dev/framwork": "pytorch"}, {},
     ["metadata.labels: trainhook.dev/framwork is not a trainhook key (did you mean trainhook.dev/framework?); "
      "trainhook ignores it: correct it"]),
    ({}, {"trainhook.dev/on-faliure": "restart-gang", "trainhook.dev/replica": "worker=2"},
     ["metadata.annotations: trainhook.dev/on-faliure is not a trainhook key (did you mean "
      "trainhook.dev/on-failure?)", "metadata.annotations: trainhook.dev/replica is not a trainhook key (did you "
      "mean trainhook.dev/replicas?)"]),
    ({"trainhook.dev/replicas": "worker=2"}, {"trainhook.dev/role": "master"},
     ["metadata.labels: trainhook.dev/replicas is a trainhook annotation, not a label; trainhook ignores it here: "
      "move it to metadata.annotations", "metadata.annotations: trainhook.dev/role is a trainhook label, not an "
      "annotation"]),
    ({}, {"trainhook.dev/xyzzy": "1"}, ["metadata.annotations: trainhook.dev/xyzzy is not a trainhook key (see the "
                                       "keys in docs/use/contract.md section 2); trainhook ignores it: remove it"]),
    ({"app": "x", "trainhook.dev/phase": "Failed", "trainhook.dev/framework": "jax"},
     {"trainhook.dev/phase": "Failed", "trainhook.dev/last-lines": "[]", "example.com/replica": "1"}, []),
])
def test_unknown_and_misplaced_keys_name_the_nearest_known_one(labels, annotations, expected):
    found = keys.unknown_keys(labels, annotations)
    assert len(found) == len(expected), found
    for line, start in zip(found, expected):
        assert line.startswith(start) or start in line, line


# --- the webhook: warnings, over HTTPS ------------------------------------------------------------------------

def test_the_webhook_warns_on_a_workload_its_template_and_its_pods_and_still_wires_them(webhook):
    sts = statefulset("ddp", 2, annotations={"trainhook.dev/on-faliure": "restart-gang"})
    sts["spec"]["template"]["metadata"]["labels"]["trainhook.dev/framwork"] = "pytorch"
    out, response = admitted(webhook, sts)
    assert response["allowed"] is True
    assert response["warnings"][:2] == [
        "metadata.annotations: trainhook.dev/on-faliure is not a trainhook key (did you mean "
        "trainhook.dev/on-failure?); trainhook ignores it: correct it",
        "spec.template.metadata.labels: trainhook.dev/framwork is not a trainhook key (did you mean "
        "trainhook.dev/framework?); trainhook ignores it: correct it"]
    assert keys.ON_FAILURE not in out["spec"]["template"]["metadata"]["annotations"]  # ignored, as it says
    pod, response = admitted(webhook, pod_of_statefulset(out, 1))
    assert response["allowed"] is True and "patch" in response  # wired all the same
    assert response["warnings"] == ["metadata.labels: trainhook.dev/framwork is not a trainhook key (did you mean "
                                    "trainhook.dev/framework?); trainhook ignores it: correct it"]
    assert {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}["RANK"] == "1"


def test_a_service_and_an_object_the_webhook_does_not_wire_are_warned_too(webhook):
    svc = service("ddp")
    svc["metadata"]["annotations"] = {"trainhook.dev/jobname": "ddp"}
    _, response = admitted(webhook, svc)
    assert response["warnings"] == ["metadata.annotations: trainhook.dev/jobname is not a trainhook key (did you "
                                    "mean trainhook.dev/job-name?); trainhook ignores it: correct it"]
    # Without the chart's objectSelector a misspelled gate label reaches the webhook: not wired, but told.
    sts = statefulset("ddp", 2)
    sts["metadata"]["labels"] = {"trainhook.dev/framewrok": "pytorch"}
    out, response = admitted(webhook, sts)
    assert "patch" not in response and out == sts
    assert response["warnings"] == ["metadata.labels: trainhook.dev/framewrok is not a trainhook key (did you mean "
                                    "trainhook.dev/framework?); trainhook ignores it: correct it"]


def test_a_refusal_caused_by_a_typo_carries_the_typo_as_a_warning(webhook):
    pod = bare_pod("p", {"trainhook.dev/job-name": "p", "trainhook.dev/index": "0"},
                   {"trainhook.dev/replica": "worker=2"})
    _, response = admitted(webhook, pod)
    assert response["allowed"] is False
    assert "trainhook.dev/replicas=None: the pod does not say its gang's shape" in response["status"]["message"]
    assert response["warnings"] == ["metadata.annotations: trainhook.dev/replica is not a trainhook key (did you "
                                    "mean trainhook.dev/replicas?); trainhook ignores it: correct it"]


# --- the CLI: explain and local refuse ------------------------------------------------------------------------

def typo_manifest(tmp_path, old: str, new: str, where: str = "everywhere") -> Path:
    """examples/pytorch/ddp.yaml with `old` written as `new` (on the StatefulSet's template only, or everywhere)."""
    docs = list(yaml.safe_load_all(DDP.read_text()))
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    places = [sts["spec"]["template"]["metadata"]] + ([sts["metadata"]] if where == "everywhere" else [])
    for meta in places:
        for field in ("labels", "annotations"):
            if old in (meta.get(field) or {}):
                meta[field][new] = meta[field].pop(old)
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def test_explain_refuses_a_misspelled_framework_instead_of_printing_empty_pods(tmp_path, capsys):
    path = typo_manifest(tmp_path, keys.FRAMEWORK, "trainhook.dev/framwork")
    assert main(["explain", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # it was four empty `# pod ddp-N` sections and exit 0
    assert captured.err.splitlines() == [
        f"error: {path}: statefulset/ddp: metadata.labels: trainhook.dev/framwork is not a trainhook key (did you "
        "mean trainhook.dev/framework?); trainhook ignores it: correct it",
        f"{path}: statefulset/ddp: spec.template.metadata.labels: trainhook.dev/framwork is not a trainhook key (did "
        "you mean trainhook.dev/framework?); trainhook ignores it: correct it",
        f"{path}: statefulset/ddp: metadata.labels: no trainhook.dev/framework, though it carries "
        "trainhook.dev/framwork and its pod template carries trainhook.dev/framwork: trainhook's webhook selects StatefulSets by that label and never sees this one, so "
        "its pods would run unwired, each on its own; label its own metadata trainhook.dev/framework: pytorch"]


def test_explain_refuses_a_typo_on_the_template_only_and_a_misspelled_annotation(tmp_path, capsys):
    path = typo_manifest(tmp_path, keys.FRAMEWORK, "trainhook.dev/framwork", where="template")
    assert main(["explain", str(path)]) == 1
    err = capsys.readouterr().err
    assert err == (f"error: {path}: statefulset/ddp: spec.template.metadata.labels: trainhook.dev/framwork is not "
                   "a trainhook key (did you mean trainhook.dev/framework?); trainhook ignores it: correct it\n")
    docs = list(yaml.safe_load_all(DDP.read_text()))
    docs[-1]["metadata"]["annotations"] = {"trainhook.dev/on-faliure": "restart-gang"}
    path.write_text(yaml.safe_dump_all(docs))
    assert main(["explain", str(path)]) == 1
    assert "did you mean trainhook.dev/on-failure?" in capsys.readouterr().err


def test_a_workload_labeled_on_its_template_only_is_refused_as_the_webhook_never_sees_it(tmp_path, capsys):
    docs = list(yaml.safe_load_all(DDP.read_text()))
    del docs[-1]["metadata"]["labels"][keys.FRAMEWORK]
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    assert main(["explain", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: statefulset/ddp: metadata.labels: no trainhook.dev/framework, though its "
                          "pod template carries trainhook.dev/framework: trainhook's webhook selects StatefulSets by "
                          "that label and never sees this one")
    assert "label its own metadata trainhook.dev/framework: pytorch" in err


def test_trainhook_local_refuses_before_running_anything(tmp_path, capsys):
    """`trainhook local` ran N independent trainings restarting forever; now it refuses naming the fix (the
    manifest is read before the host is checked or anything started, so no network namespace is made)."""
    path = typo_manifest(tmp_path, keys.FRAMEWORK, "trainhook.dev/framwork")
    assert main(["local", str(path), "--workdir", str(tmp_path / "run")]) != 0
    captured = capsys.readouterr()
    assert "did you mean trainhook.dev/framework?" in captured.err
    assert "label its own metadata trainhook.dev/framework: pytorch" in captured.err
    assert "starting" not in captured.out and not (tmp_path / "run" / "pods").exists()


def test_explain_of_a_kubeflow_job_says_to_convert_it(capsys):
    for example in sorted((ROOT / "examples" / "kubeflow").glob("*.yaml")):
        assert main(["explain", str(example)]) == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        job = yaml.safe_load(example.read_text())
        assert captured.err == (f"error: {job['kind']}/{job['metadata']['name']}: a Kubeflow job, which trainhook's "
                                "webhook never sees (it wires StatefulSets, Jobs and Pods); convert it first: "
                                f"trainhook convert {example} | trainhook explain -\n")


def test_explain_of_nothing_labeled_exits_1_and_lists_what_it_left_out(tmp_path, capsys):
    plain = statefulset("web", 2)
    for meta in (plain["metadata"], plain["spec"]["template"]["metadata"]):
        meta["labels"] = {"app": "web"}
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump(plain))
    assert main(["explain", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "Warning: not explained (no pods of trainhook's): StatefulSet/web (apps/v1; not labeled " \
           "trainhook.dev/framework)" in captured.err
    assert f"error: {path}: no StatefulSet, Job or Pod labeled trainhook.dev/framework" in captured.err
    path.write_text(DDP.read_text() + "---\n" + yaml.safe_dump(plain))  # beside a gang: left out, not explained
    assert main(["explain", str(path)]) == 0
    captured = capsys.readouterr()
    assert "# pod web-0" not in captured.out and "# pod ddp-3" in captured.out


# --- convert and render (the SDK) refuse ----------------------------------------------------------------------

def test_convert_refuses_a_misspelled_key_on_the_job_or_a_template(tmp_path, capsys):
    job = yaml.safe_load((ROOT / "examples" / "kubeflow" / "pytorchjob.yaml").read_text())
    job["metadata"]["annotations"] = {"trainhook.dev/max-restart": "2"}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    assert main(["convert", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("error: PyTorchJob/pytorch-mnist: metadata.annotations: trainhook.dev/max-restart is not "
                            "a trainhook key (did you mean trainhook.dev/max-restarts?); trainhook ignores it: "
                            "correct it\n")
    del job["metadata"]["annotations"]
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    worker.setdefault("metadata", {})["annotations"] = {"trainhook.dev/gangwait": "tcp"}
    path.write_text(yaml.safe_dump(job))
    assert main(["convert", str(path)]) == 1
    assert ("spec.pytorchReplicaSpecs.Worker.template.metadata.annotations: trainhook.dev/gangwait is not a "
            "trainhook key (did you mean trainhook.dev/gang-wait?)") in capsys.readouterr().err


def test_render_refuses_a_misspelled_key_in_a_given_template():
    template = {"metadata": {"annotations": {"trainhook.dev/nproc-per-nod": "2"}},
                "spec": {"containers": [{"name": "t", "image": "i", "command": ["python"]}]}}
    with pytest.raises(RenderError, match=r"role worker: template\.metadata\.annotations: trainhook\.dev/"
                                          r"nproc-per-nod is not a trainhook key \(did you mean "
                                          r"trainhook\.dev/nproc-per-node\?\)"):
        gang_objects(Gang(name="g", framework="pytorch", roles=[("worker", 2, template)]))
