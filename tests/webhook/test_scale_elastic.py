"""Elastic PyTorch gangs at admission (issue 18): the template's shape does not follow spec.replicas within
min..max (so nothing rolls on a scale), any index below max is admitted, max and beyond is refused naming
trainhook.dev/elastic; and the scale and Job-parallelism reviews answered through the review machinery."""

from __future__ import annotations

import copy

import pytest

from trainhook.webhook.admission.member import Denied
from trainhook.webhook.admission.mutate import mutate
from trainhook.webhook.admission.review import BadReview, review
from trainhook.webhook.settings import Settings
from objects import indexed_job, pod_of_statefulset, statefulset

SETTINGS = Settings(launcher_image="registry.example/launcher:1", wait_timeout=300)


def elastic(replicas: int, annotations: dict | None = None, **kwargs) -> dict:
    return statefulset("el", replicas, annotations={"trainhook.dev/elastic": "2:4", **(annotations or {})}, **kwargs)


def admitted(obj: dict, operation: str = "CREATE") -> dict:
    return mutate(obj["kind"], operation, obj, "team-a", SETTINGS).obj


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_the_template_of_an_elastic_gang_is_the_same_at_every_size_within_its_range():
    templates = [admitted(elastic(n))["spec"]["template"] for n in (2, 3, 4, 0)]
    assert all(t == templates[0] for t in templates)
    assert templates[0]["metadata"]["annotations"]["trainhook.dev/replicas"] == "worker=4"
    # and a kubectl apply of a new spec.replicas over the stored object changes nothing but spec.replicas
    stored = admitted(elastic(2))
    applied = copy.deepcopy(stored)
    applied["spec"]["replicas"] = 3
    assert admitted(applied, "UPDATE") == applied


def test_a_fixed_gang_still_takes_its_shape_from_spec_replicas():
    assert admitted(statefulset("ddp", 3))["spec"]["template"]["metadata"]["annotations"][
        "trainhook.dev/replicas"] == "worker=3"


@pytest.mark.parametrize("replicas", [1, 5])
def test_spec_replicas_outside_the_range_is_refused_at_apply(replicas):
    with pytest.raises(Denied) as refused:
        admitted(elastic(replicas))
    assert refused.value.problems == [
        f"spec.replicas={replicas!r}: the elastic gang (trainhook.dev/elastic=2:4) would have {replicas} members; "
        "set spec.replicas within 2..4, or change trainhook.dev/elastic"]


def test_a_malformed_range_is_refused_at_apply():
    with pytest.raises(Denied) as refused:
        admitted(elastic(2, {"trainhook.dev/elastic": "4:2"}))
    assert refused.value.problems == ["trainhook.dev/elastic='4:2': not an elastic range; write min:max with "
                                      "1 <= min <= max, e.g. 2:4"]


@pytest.mark.parametrize("index", [0, 1, 2, 3])
def test_every_index_below_max_is_admitted_with_the_same_rendezvous(index):
    pod = admitted(pod_of_statefulset(admitted(elastic(2)), index))
    env = env_of(pod)
    assert {k: env[k] for k in ("PET_NNODES", "PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_ID")} == {
        "PET_NNODES": "2:4", "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "el-0.el:23456", "PET_RDZV_ID": "el"}
    assert "WORLD_SIZE" not in env and "RANK" not in env
    assert env["TRAINHOOK_REPLICAS"] == "worker=4" and env["TRAINHOOK_INDEX"] == str(index)


def test_a_template_stamped_before_elastic_admission_grew_is_admitted_up_to_max():
    """A StatefulSet stored with the replica count as its shape (an older webhook) still scales within range."""
    sts = admitted(elastic(2))
    sts["spec"]["template"]["metadata"]["annotations"]["trainhook.dev/replicas"] = "worker=2"
    assert env_of(admitted(pod_of_statefulset(sts, 3)))["TRAINHOOK_REPLICAS"] == "worker=4"


def test_an_index_at_max_is_refused_naming_the_elastic_annotation():
    with pytest.raises(Denied) as refused:
        admitted(pod_of_statefulset(admitted(elastic(4)), 4))
    assert refused.value.problems == [
        "trainhook.dev/elastic='2:4': index 4 of role worker is beyond the elastic gang's maximum of 4 members "
        "(4 workers); scale the workload to at most 4, or raise the maximum"]


def test_a_fixed_gangs_extra_index_is_still_refused_as_before():
    with pytest.raises(Denied) as refused:
        admitted(pod_of_statefulset(admitted(statefulset("ddp", 2)), 2))
    assert "index 2 of role worker is outside the gang" in refused.value.problems[0]


# --- reviews ---------------------------------------------------------------------------------------------------

class Cache:
    """A stand-in for the StatefulSet cache's read side (the real cache and watch: tests/cluster/test_scale_cluster.py)."""

    def __init__(self, synced: bool, *objects: dict):
        self.synced = synced
        self.objects = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects}

    def get(self, namespace: str, name: str) -> dict | None:
        return self.objects.get((namespace, name))


def scale_review(name: str, old: int | None, new: int, namespace: str = "team-a") -> dict:
    """Shaped as kube-apiserver sends a statefulsets/scale UPDATE: an autoscaling/v1 Scale without labels; a
    replicas of 0 is omitted (ScaleSpec's omitempty)."""
    def scale(replicas):
        return {"apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": name, "namespace": namespace, "uid": "u", "resourceVersion": "7"},
                "spec": {"replicas": replicas} if replicas else {}, "status": {"replicas": old or 0}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "r-1", "kind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
        "resource": {"group": "apps", "version": "v1", "resource": "statefulsets"}, "subResource": "scale",
        "name": name, "namespace": namespace, "operation": "UPDATE", "object": scale(new),
        "oldObject": scale(old) if old is not None else None}}


DDP = admitted(statefulset("ddp", 3))
ELASTIC = admitted(elastic(3))


def test_a_scale_of_a_fixed_gang_is_refused_with_check_scales_message():
    reviewed = review(scale_review("ddp", 3, 4), SETTINGS, Cache(True, DDP))
    response = reviewed.answer["response"]
    assert response["allowed"] is False and response["status"]["code"] == 403
    assert response["status"]["message"].startswith("trainhook: StatefulSet team-a/ddp is a 3-member pytorch gang")
    assert (reviewed.outcome, reviewed.reasons) == ("denied", ["spec.replicas"])


@pytest.mark.parametrize("name,old,new", [("ddp", 3, 0), ("ddp", 0, 3), ("el", 3, 2), ("el", 2, 4),
                                          ("web", 1, 9)])
def test_allowed_scales(name, old, new):
    assert review(scale_review(name, old, new), SETTINGS, Cache(True, DDP, ELASTIC)).answer["response"] == {
        "uid": "r-1", "allowed": True}


def test_the_size_compared_is_the_api_servers_not_the_caches():
    """The cache may lag: a gang the launcher just scaled to 0 comes back at its size though the cache says 3."""
    stale = copy.deepcopy(DDP)
    assert review(scale_review("ddp", 0, 3), SETTINGS, Cache(True, stale)).answer["response"]["allowed"] is True
    assert review(scale_review("ddp", 0, 5), SETTINGS, Cache(True, stale)).answer["response"]["allowed"] is False


def test_an_elastic_scale_outside_the_range_is_refused():
    message = review(scale_review("el", 3, 5), SETTINGS, Cache(True, ELASTIC)).answer["response"]["status"]["message"]
    assert "trainhook.dev/elastic='2:4'" in message and "scale within 2..4" in message


@pytest.mark.parametrize("cache", [None, Cache(False)])
def test_before_the_cache_is_listed_a_scale_is_allowed_with_a_warning(cache):
    response = review(scale_review("ddp", 3, 4), SETTINGS, cache).answer["response"]
    assert response["allowed"] is True
    assert response["warnings"] == ["trainhook: the size change of StatefulSet team-a/ddp was not checked (the "
                                    "webhook has not listed the StatefulSets yet); a trainhook gang that is not "
                                    "elastic cannot change size while it runs"]


def test_a_malformed_scale_is_a_bad_review():
    body = scale_review("ddp", 3, 4)
    body["request"]["object"]["spec"]["replicas"] = "four"
    with pytest.raises(BadReview, match="request.object.spec.replicas must be an integer"):
        review(body, SETTINGS, Cache(True, DDP))


def job_update(old: dict, parallelism: int) -> dict:
    new = copy.deepcopy(old)
    new["spec"]["parallelism"] = parallelism
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "j-1", "kind": {"group": "batch", "version": "v1", "kind": "Job"},
        "resource": {"group": "batch", "version": "v1", "resource": "jobs"}, "namespace": "team-a",
        "operation": "UPDATE", "object": new, "oldObject": old}}


def test_a_labeled_jobs_parallelism_change_is_refused_and_other_updates_pass():
    job = admitted(indexed_job("ij", 3))
    refused = review(job_update(job, 2), SETTINGS).answer["response"]
    assert refused["allowed"] is False
    assert "Job team-a/ij is a 3-member pytorch gang" in refused["status"]["message"]
    assert review(job_update(job, 0), SETTINGS).answer["response"]["allowed"] is True
    assert review(job_update(job, 3), SETTINGS).answer["response"]["allowed"] is True


# --- the cache the scale reviews read (its list+watch against a real API server: tests/cluster/test_scale_cluster.py) ---

def test_the_cache_keeps_only_gangs_cut_down_to_what_check_scale_reads():
    from trainhook.webhook.admission.scale import check_scale
    from trainhook.webhook.statefulset_cache import StatefulSetCache
    plain = statefulset("web", 2)
    for labels in (plain["metadata"]["labels"], plain["spec"]["template"]["metadata"]["labels"]):
        del labels["trainhook.dev/framework"]
    cache = StatefulSetCache()
    assert not cache.synced
    cache.replace([DDP, ELASTIC, plain])
    assert cache.synced and len(cache) == 2 and cache.get("team-a", "web") is None
    kept = cache.get("team-a", "ddp")
    assert "spec" not in kept["spec"]["template"] and "containers" not in str(kept)
    for workload in (DDP, ELASTIC):
        for size in range(6):
            assert check_scale(cache.get("team-a", workload["metadata"]["name"]), size) == check_scale(workload, size)


def test_watch_events_add_change_and_drop_entries():
    from trainhook.webhook.statefulset_cache import StatefulSetCache
    cache = StatefulSetCache()
    cache.replace([])
    cache.apply("ADDED", DDP)
    assert cache.get("team-a", "ddp")["spec"]["replicas"] == 3
    cache.apply("MODIFIED", {**DDP, "spec": {**DDP["spec"], "replicas": 0}})
    assert cache.get("team-a", "ddp")["spec"]["replicas"] == 0
    unlabeled = copy.deepcopy(DDP)
    for labels in (unlabeled["metadata"]["labels"], unlabeled["spec"]["template"]["metadata"]["labels"]):
        del labels["trainhook.dev/framework"]
    cache.apply("MODIFIED", unlabeled)  # the label went away: no longer a gang
    assert cache.get("team-a", "ddp") is None
    cache.apply("ADDED", ELASTIC)
    cache.apply("DELETED", ELASTIC)
    assert len(cache) == 0


def test_over_https_a_malformed_scale_review_is_a_400_and_an_unchecked_one_a_warning(tmp_path):
    from webhook_process import start_webhook
    hook = start_webhook(tmp_path)  # without --watch-statefulsets: nothing to check a scale against
    try:
        body = scale_review("ddp", 3, 4)
        body["request"]["oldObject"]["spec"]["replicas"] = [3]
        reply = hook.post(body)
        assert reply.status_code == 400
        assert reply.json() == {"error": "request.oldObject.spec.replicas must be an integer, got list"}
        reply = hook.post(scale_review("ddp", 3, 4))
        assert reply.status_code == 200
        response = reply.json()["response"]
        assert response["allowed"] is True and "was not checked" in response["warnings"][0]
    finally:
        hook.stop()
