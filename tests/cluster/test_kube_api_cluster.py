"""The launcher's standard-library API client (launcher/mpi/kube_api.py, and tests/support/outcome_api.py on it) against
the real Kubernetes v1.20 API server (tests/support/cluster_api.py), called as a pod calls it: the ServiceAccount's token and
CA in a directory, the server at KUBERNETES_SERVICE_HOST/PORT. With a Role granting what a recorder needs bound
(the chart grants training pods nothing since issue 22: the notary records for them, tests/cluster/test_notary_cluster.py;
outcome_api stays as the tests' recorder, tests/support/launcher_outcomes.py) it reads, records (a merge patch of metadata
only: the workload's generation does not move, so nothing rolls) and scales a StatefulSet to zero; without it, and
for a workload that does not exist, the refusal is one line in the API server's words. The admin's JSON kubeconfig
(client certificate data) works outside a pod."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import pytest
from kubernetes import client

from cluster_api import wait_for_service_account_token
import outcome_api
from trainhook.launcher.mpi import kube_api
from trainhook.launcher.outcome import FAILED, Outcome

pytestmark = pytest.mark.cluster
OUTCOME = Outcome(FAILED, 3, "rank 2 (worker-2 at train-2.train) exited with 3", 2, "2025-06-01T12:00:00Z")
# What outcome_api's calls need, and nothing more (the notary's ClusterRole grants the same verbs to the webhook).
RECORDER_RULES = [{"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["get", "patch"]},
                  {"apiGroups": ["apps"], "resources": ["statefulsets/scale"], "verbs": ["patch"]},
                  {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "patch"]}]


def service_account(plane, api, namespace: str, name: str, directory: Path) -> kube_api.Client:
    """The client a pod of ServiceAccount `name` gets: its token and the CA in `directory`."""
    client.CoreV1Api(api).create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    directory.mkdir(parents=True)
    (directory / "token").write_text(wait_for_service_account_token(api, namespace, name))
    (directory / "ca.crt").write_bytes(plane.ca_pem)
    url = urlparse(plane.host)
    return kube_api.in_cluster(directory, {"KUBERNETES_SERVICE_HOST": url.hostname,
                                           "KUBERNETES_SERVICE_PORT": str(url.port)})


@pytest.fixture
def workloads(control_plane, k8s_namespace, tmp_path):
    """A StatefulSet and a Job named `train`, and clients for `trainer` (bound to a Role of RECORDER_RULES in the
    namespace) and `nobody`."""
    ns = k8s_namespace
    with control_plane.api_client() as api:
        rbac = client.RbacAuthorizationV1Api(api)
        rbac.create_namespaced_role(ns, {"metadata": {"name": "recorder"}, "rules": RECORDER_RULES})
        rbac.create_namespaced_role_binding(ns, {
            "metadata": {"name": "recorder-trainer"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "recorder"},
            "subjects": [{"kind": "ServiceAccount", "name": "trainer", "namespace": ns}]})
        template = {"metadata": {"labels": {"app": "train"}},
                    "spec": {"containers": [{"name": "trainer", "image": "registry.example/t:1"}]}}
        client.AppsV1Api(api).create_namespaced_stateful_set(ns, {
            "metadata": {"name": "train"}, "spec": {"replicas": 2, "serviceName": "train", "template": template,
                                                    "selector": {"matchLabels": {"app": "train"}}}})
        client.BatchV1Api(api).create_namespaced_job(ns, {"metadata": {"name": "train"}, "spec": {
            "template": {**template, "spec": {**template["spec"], "restartPolicy": "Never"}}}})
        trainer = service_account(control_plane, api, ns, "trainer", tmp_path / "trainer")
        nobody = service_account(control_plane, api, ns, "nobody", tmp_path / "nobody")
        yield api, ns, trainer, nobody  # the Role and its binding go with the namespace


def test_the_outcome_is_recorded_read_back_and_the_statefulset_scaled_to_zero(workloads):
    api, ns, trainer, _ = workloads
    apps = client.AppsV1Api(api)
    generation = apps.read_namespaced_stateful_set("train", ns).metadata.generation
    assert outcome_api.read_outcome(trainer, "StatefulSet", "train", ns) is None
    outcome_api.record_outcome(trainer, "StatefulSet", "train", ns, OUTCOME)
    recorded = outcome_api.read_outcome(trainer, "StatefulSet", "train", ns)
    assert (recorded.phase, recorded.code, recorded.reason, recorded.time) == (
        OUTCOME.phase, OUTCOME.code, OUTCOME.reason, OUTCOME.time)
    sts = apps.read_namespaced_stateful_set("train", ns)
    assert sts.metadata.annotations == OUTCOME.annotations() and sts.metadata.generation == generation
    outcome_api.scale_to_zero(trainer, "train", ns)
    assert apps.read_namespaced_stateful_set("train", ns).spec.replicas == 0


def test_a_jobs_outcome_is_recorded_too(workloads):
    api, ns, trainer, _ = workloads
    outcome_api.record_outcome(trainer, "Job", "train", ns, OUTCOME)
    assert outcome_api.read_outcome(trainer, "Job", "train", ns).reason == OUTCOME.reason
    assert client.BatchV1Api(api).read_namespaced_job("train", ns).metadata.annotations == OUTCOME.annotations()


def test_without_the_role_every_call_is_refused_in_the_servers_words_with_the_fix(workloads):
    _, ns, _, nobody = workloads
    user = f"system:serviceaccount:{ns}:nobody"
    fix = (": this needs get/patch on the gang's workloads, which the chart grants no training pod (the "
           "notary records outcomes: docs/operate/security.md)")
    for call, verb, resource in (
            (lambda: outcome_api.read_outcome(nobody, "StatefulSet", "train", ns), "get", "statefulsets"),
            (lambda: outcome_api.record_outcome(nobody, "Job", "train", ns, OUTCOME), "patch", "jobs"),
            (lambda: outcome_api.scale_to_zero(nobody, "train", ns), "patch", "statefulsets/scale")):
        with pytest.raises(outcome_api.Unavailable) as refused:
            call()
        message = str(refused.value)
        assert f'is forbidden: User "{user}" cannot {verb} resource "{resource}"' in message
        assert message.endswith(f"(HTTP 403){fix}") and "\n" not in message


def test_a_missing_workload_is_named(workloads):
    _, ns, trainer, _ = workloads
    with pytest.raises(outcome_api.Unavailable) as missing:
        outcome_api.record_outcome(trainer, "StatefulSet", "gone", ns, OUTCOME)
    assert str(missing.value) == ('cannot record the outcome on StatefulSet/gone: statefulsets.apps "gone" not found '
                                  '(HTTP 404)')


def test_the_admins_json_kubeconfig_with_certificate_data_works_outside_a_pod(
        control_plane, k8s_namespace):
    admin = kube_api.any_client("/nonexistent", {"KUBECONFIG": str(control_plane.kubeconfig)})
    assert admin.get(f"/api/v1/namespaces/{k8s_namespace}")["metadata"]["name"] == k8s_namespace
