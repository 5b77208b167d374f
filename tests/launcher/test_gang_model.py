"""The gang model's home (trainhook/gang/, issue 24 items 1 and 2): every parse of `role=count` and `min:max`, ranks
and elastic shapes; the one lookup across a workload and its pod template, its precedence and its refusal; and
what keeps the model in one place (TRAINHOOK_* names defined in keys.py only, no framework compared by name outside
the frameworks' own modules, the launcher's table agreeing with them)."""

from __future__ import annotations

import ast
import copy
from pathlib import Path

import pytest

from trainhook.gang import keys
from trainhook.gang import shape as model
from trainhook.gang.lookup import ANNOTATIONS, LABELS, lookup, setting
from trainhook.gang.shape import Shape, ShapeError, elastic_shape, parse_range, parse_shape, size_of, split_pairs
from trainhook.gang import framework_rules
from trainhook.launcher.pod_view import ConfigError, parse_gang
from trainhook.webhook.admission import frameworks
from trainhook.webhook.admission.member import Denied, Problems
from trainhook.webhook.admission.member import parse_shape as webhook_shape
from trainhook.webhook.admission.mutate import mutate
from trainhook.webhook.settings import Settings
from objects import indexed_job, pod_of_statefulset, statefulset

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = Settings(launcher_image="registry.example/launcher:1", wait_timeout=300)


# --- role=count -------------------------------------------------------------------------------------------------

def test_a_shape_keeps_the_order_written_and_counts_ranks_across_roles():
    shape = parse_shape(" master=1 , worker=3")
    assert shape == Shape((("master", 1), ("worker", 3))) and str(shape) == "master=1,worker=3"
    assert shape.size == 4 and shape.roles == ("master", "worker") and shape.count("ps") == 0
    assert [shape.rank("master", 0), shape.rank("worker", 0), shape.rank("worker", 2)] == [0, 1, 3]
    with pytest.raises(KeyError):
        shape.rank("ps", 0)


def test_in_order_sorts_by_a_frameworks_rank_order():
    assert str(parse_shape("worker=2,ps=1,chief=1").in_order(keys.ROLES[keys.TENSORFLOW])) == "chief=1,ps=1,worker=2"


@pytest.mark.parametrize("text,roles,kind,part", [
    ("master", (), model.SYNTAX, "master"),
    ("=2", (), model.SYNTAX, "=2"),
    ("worker=", (), model.SYNTAX, "worker="),
    ("worker=x", (), model.COUNT, "worker=x"),
    ("worker=-1", (), model.COUNT, "worker=-1"),
    ("ps=1", ("master", "worker"), model.ROLE, "ps"),
    ("worker=1,worker=2", (), model.TWICE, "worker"),
    ("master=0,worker=0", (), model.EMPTY, "master=0,worker=0"),
])
def test_each_malformed_shape_names_what_is_wrong(text, roles, kind, part):
    with pytest.raises(ShapeError) as error:
        parse_shape(text, roles)
    assert (error.value.kind, error.value.part) == (kind, part)


def test_the_checks_of_a_part_come_in_the_webhooks_order_count_before_role_before_twice():
    for text, kind in (("ps=x", model.COUNT), ("worker=1,ps=1,worker=1", model.ROLE)):
        with pytest.raises(ShapeError) as error:
            parse_shape(text, ("master", "worker"))
        assert error.value.kind == kind


def test_pairs_keep_any_value_and_refuse_a_name_twice():
    assert split_pairs("master=g-master, worker=g-worker") == [("master", "g-master"), ("worker", "g-worker")]
    for text, kind in (("master=a,master=b", model.TWICE), ("master", model.SYNTAX)):
        with pytest.raises(ShapeError) as error:
            split_pairs(text)
        assert error.value.kind == kind


def test_size_of_is_zero_for_what_does_not_parse():
    assert [size_of("master=1,worker=3"), size_of("worker=x"), size_of(""), size_of("worker=0")] == [4, 0, 0, 0]


def test_the_webhook_and_the_launcher_word_the_same_errors_as_before():
    problems = Problems()
    assert webhook_shape("master=1,worker=x", keys.PYTORCH, problems) is None
    assert problems == ["trainhook.dev/replicas='master=1,worker=x': cannot parse 'worker=x'; write role=count pairs "
                        "separated by commas, e.g. master=1,worker=3"]
    for text, said in (("chief=1", "'chief' is not a pytorch role; use roles from master, worker"),
                       ("worker=1,worker=2", "role 'worker' appears twice; list each role once"),
                       ("worker=0", "the gang has no replicas; give at least one role a count >= 1")):
        problems = Problems()
        webhook_shape(text, keys.PYTORCH, problems)
        assert problems == [f"trainhook.dev/replicas={text!r}: {said}"]
    assert str(webhook_shape("worker=3,master=1", keys.PYTORCH, Problems())) == "master=1,worker=3"
    env = {keys.TH_FRAMEWORK: "pytorch", keys.TH_JOB_NAME: "g", keys.TH_NAMESPACE: "ns", keys.TH_ROLE: "worker",
           keys.TH_INDEX: "0", keys.TH_HOSTS: "worker=g", keys.TH_SUBDOMAIN: "g"}
    for text, said in (("worker=x", "counts must be non-negative integers"),
                       ("worker", "cannot parse 'worker'; expected role=value[,role=value]"),
                       ("worker=0", "the gang has no members")):
        with pytest.raises(ConfigError) as error:
            parse_gang({**env, keys.TH_REPLICAS: text})
        assert f"TRAINHOOK_REPLICAS={text!r}: {said}" in error.value.problems


# --- min:max and elastic shapes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [("2:4", (2, 4)), (" 1:1 ", (1, 1)), ("3:10", (3, 10))])
def test_a_range(text, expected):
    assert parse_range(text) == expected


@pytest.mark.parametrize("text", ["4:2", "0:2", "2", "2:", ":4", "a:b", "1:2:3", "", "-1:2"])
def test_not_a_range(text):
    with pytest.raises(ShapeError) as error:
        parse_range(text)
    assert error.value.kind == model.RANGE


def test_an_elastic_shape_grows_one_role_to_max_members_and_never_shrinks():
    assert str(elastic_shape(parse_shape("worker=2"), "worker", (2, 4))) == "worker=4"
    assert str(elastic_shape(parse_shape("master=1,worker=2"), "worker", (2, 4))) == "master=1,worker=3"
    assert str(elastic_shape(parse_shape("worker=5"), "worker", (2, 4))) == "worker=5"


def test_the_webhook_and_the_launcher_wire_an_elastic_pod_alike():
    """The same stored elastic StatefulSet: the webhook's pod env and the launcher's reading of it agree on the
    grown shape, the range and the rank."""
    sts = mutate("StatefulSet", "CREATE", statefulset("el", 2, annotations={keys.ELASTIC: "2:4"}), "team-a",
                 SETTINGS).obj
    pod = mutate("Pod", "CREATE", pod_of_statefulset(sts, 3), "team-a", SETTINGS).obj
    env = {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}
    assert env[keys.TH_REPLICAS] == "worker=4" and env[keys.TH_ELASTIC] == "2:4"
    gang = parse_gang(env)
    assert (gang.elastic, gang.rank, gang.size) == ((2, 4), 3, 4)


# --- the one lookup ---------------------------------------------------------------------------------------------

def workload(own: dict | None = None, template: dict | None = None, field: str = ANNOTATIONS) -> dict:
    return {"kind": "StatefulSet", "metadata": {field: own or {}},
            "spec": {"template": {"metadata": {field: template or {}}}}}


def test_the_template_comes_first_then_the_workload_and_empty_is_unset():
    assert setting(workload({keys.ELASTIC: "2:4"}), keys.ELASTIC) == "2:4"
    assert setting(workload(template={keys.ELASTIC: "1:3"}), keys.ELASTIC) == "1:3"
    assert setting(workload({keys.ELASTIC: "2:4"}, {keys.ELASTIC: "1:3"}), keys.ELASTIC) == "1:3"
    assert setting(workload({keys.ELASTIC: "2:4"}, {keys.ELASTIC: ""}), keys.ELASTIC) == "2:4"
    assert setting(workload(), keys.ELASTIC) is None
    assert setting(workload({keys.ROLE: "master"}, field=LABELS), keys.ROLE, LABELS) == "master"
    assert setting(workload({keys.ROLE: "master"}, field=LABELS), keys.ROLE) is None  # a label is not an annotation


@pytest.mark.parametrize("broken", [{}, {"metadata": None, "spec": None}, {"spec": {"template": "x"}},
                                    {"metadata": {"annotations": ["x"]}, "spec": {"template": {"metadata": 3}}}])
def test_a_malformed_object_has_no_setting(broken):
    assert setting(broken, keys.ELASTIC) is None


def test_agreeing_places_are_no_conflict_and_differing_ones_are_refused_naming_both():
    assert not lookup(workload({keys.ELASTIC: "2:4"}, {keys.ELASTIC: "2:4"}), keys.ELASTIC).conflict
    found = lookup(workload({keys.JOB_NAME: "a"}, {keys.JOB_NAME: "b"}, LABELS), keys.JOB_NAME, LABELS)
    assert found.conflict and found.value == "b"
    assert found.refusal("StatefulSet") == ("the StatefulSet's label says 'a' but its pod template's says 'b'",
                                            "make the two agree, or write the label in one place only")


def test_admission_refuses_an_annotation_the_workload_and_its_template_disagree_on():
    sts = statefulset("el", 2, annotations={keys.ELASTIC: "2:4", keys.MAX_RESTARTS: "3"})
    sts["spec"]["template"]["metadata"]["annotations"] = {keys.ELASTIC: "1:3", keys.MAX_RESTARTS: "3"}
    with pytest.raises(Denied) as refused:
        mutate("StatefulSet", "CREATE", sts, "team-a", SETTINGS)
    assert refused.value.problems == [
        "trainhook.dev/elastic='2:4': the StatefulSet's annotation says '2:4' but its pod template's says '1:3'; "
        "make the two agree, or write the annotation in one place only"]
    job = indexed_job("j", 2, annotations={keys.ON_FAILURE: keys.RESTART_GANG})
    job["spec"]["template"]["metadata"]["annotations"] = {keys.ON_FAILURE: keys.FAIL_GANG}
    with pytest.raises(Denied, match="the Job's annotation says 'restart-gang' but its pod template's says"):
        mutate("Job", "CREATE", job, "team-a", SETTINGS)


def test_an_annotation_in_both_places_alike_is_admitted_and_stamped_once():
    sts = statefulset("el", 2, annotations={keys.ELASTIC: "2:4"})
    sts["spec"]["template"]["metadata"]["annotations"] = {keys.ELASTIC: "2:4"}
    stamped = mutate("StatefulSet", "CREATE", copy.deepcopy(sts), "team-a", SETTINGS).obj
    assert stamped["spec"]["template"]["metadata"]["annotations"][keys.ELASTIC] == "2:4"


# --- what keeps the model in one place --------------------------------------------------------------------------

def test_the_launchers_framework_table_says_what_the_framework_modules_declare():
    declared = {name for name in keys.ROLES if frameworks.is_elastic(name)}
    assert declared == set(framework_rules.ELASTIC) == {keys.PYTORCH}
    assert frameworks.elastic_range(keys.PYTORCH, "2:4") == (2, 4)
    assert frameworks.elastic_range(keys.XGBOOST, "2:4") is None and frameworks.elastic_range(keys.PYTORCH, "4:2") is None


def product_files() -> list[Path]:
    """Every module of the product: the folders webhook/, launcher/ and certs/ at the top are trainhook/'s own."""
    return sorted(p for p in (ROOT / "trainhook").rglob("*.py") if "__pycache__" not in p.parts)


FRAMEWORK_MODULES = ("trainhook/webhook/admission/frameworks/", "trainhook/gang/framework_rules.py",
                     "trainhook/launcher/mpi/", "trainhook/launcher/tf_config.py", "trainhook/launcher/torchrun.py")


def test_no_framework_is_compared_by_name_outside_the_frameworks_own_modules():
    """`framework == keys.PYTORCH` and friends, in the webhook and the launcher: a framework's rules live in
    webhook/admission/frameworks/, and on the launcher's side in its table (framework_rules.py) and in the framework's own
    commands (mpi/, tf_config.py, torchrun.py: each checks that the gang is of its framework)."""
    names = {f"keys.{name}" for name in ("PYTORCH", "TENSORFLOW", "MPI", "XGBOOST", "JAX", "PADDLE", "MXNET")}
    found = []
    for path in product_files():
        relative = path.relative_to(ROOT).as_posix()
        if not relative.startswith(("trainhook/webhook/", "trainhook/launcher/", "trainhook/gang/")) \
                or relative.startswith(FRAMEWORK_MODULES):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(
                    ast.unparse(side) in names for side in [node.left, *node.comparators]):
                found.append(f"{relative}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_every_trainhook_variable_name_is_defined_in_keys_only():
    defined = {}
    for path in product_files():
        relative = path.relative_to(ROOT).as_posix()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                    and str(node.value.value).startswith("TRAINHOOK_") \
                    and any(isinstance(t, ast.Name) and t.id.startswith("TH_") for t in node.targets):
                defined.setdefault(relative, []).append(node.targets[0].id)
    outside = {path: names for path, names in defined.items() if path != "trainhook/gang/keys.py"}
    assert outside == {}
    assert len(defined["trainhook/gang/keys.py"]) == len(set(defined["trainhook/gang/keys.py"])) >= 30

