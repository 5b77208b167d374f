"""TF_CONFIG against what Kubeflow's TFJob controller writes for the same shapes, field by field.

Golden data: the TF_CONFIG kubeflow/training-operator (v1.8/v1.9) sets for a TFJob named `mnist` in namespace
`team-a`, written out by hand from its code and tests:
- pkg/controller.v1/tensorflow/tensorflow.go: `genTFConfigJSONStr` marshals {cluster, task {type, index},
  environment: "cloud"} with Go's encoding/json (compact; map keys, i.e. roles, sorted); `genClusterSpec` lists
  every replica type, lower-cased, each address `<job>-<role>-<i>.<namespace>.svc:<port>` in index order;
- pkg/controller.v1/tensorflow/tfjob_controller.go: `SetClusterSpec` sets no TF_CONFIG when `isDistributed` is
  false, i.e. when the job has exactly one replica in all (kubeflow/training-operator#1078);
- pkg/controller.v1/tensorflow/pod_test.go, "Test ClusterSpec": the expected strings the first cases below copy
  (1 worker: none; 1 worker + 1 ps; 1 worker + 1 ps + 1 evaluator, the evaluator *in* the cluster).
The evaluator: training-operator lists it in the cluster, as trainhook's contract requires. The older
kubeflow/tf-operator (v1alpha2 and early v1: `if rtype == TFReplicaTypeEval { continue }` in genClusterSpec)
left it out; on that point the contract, and today's Kubeflow, win.

Addresses aside: trainhook's are `<hostname>.<subdomain>:<port>` (contract section 3) where Kubeflow's are
`<hostname>.<namespace>.svc:<port>`. With one workload per role named `<job>-<role>` (the contract's multi-role
layout) the hostnames are Kubeflow's pod names, so only the part after the hostname differs.
"""

from __future__ import annotations

import json

import pytest

from trainhook.webhook.admission.mutate import mutate
from trainhook.webhook.settings import Settings
from objects import indexed_job, pod_of_job, pod_of_statefulset, statefulset

SETTINGS = Settings()
JOB, NAMESPACE = "mnist", "team-a"
KF_DOMAIN, OUR_DOMAIN = f"{NAMESPACE}.svc", JOB


def kf(cluster: str, role: str, index: int) -> str:
    return f'{{"cluster":{{{cluster}}},"task":{{"type":"{role}","index":{index}}},"environment":"cloud"}}'


PS1_W1 = '"ps":["mnist-ps-0.team-a.svc:2222"],"worker":["mnist-worker-0.team-a.svc:2222"]'
EVAL = ('"evaluator":["mnist-evaluator-0.team-a.svc:2222"],"ps":["mnist-ps-0.team-a.svc:2222"],'
        '"worker":["mnist-worker-0.team-a.svc:2222"]')
PS_GANG = ('"chief":["mnist-chief-0.team-a.svc:2222"],'
           '"ps":["mnist-ps-0.team-a.svc:2222","mnist-ps-1.team-a.svc:2222"],'
           '"worker":["mnist-worker-0.team-a.svc:2222","mnist-worker-1.team-a.svc:2222"]')
FULL = ('"chief":["mnist-chief-0.team-a.svc:2223"],"evaluator":["mnist-evaluator-0.team-a.svc:2223"],'
        '"ps":["mnist-ps-0.team-a.svc:2223"],'
        '"worker":["mnist-worker-0.team-a.svc:2223","mnist-worker-1.team-a.svc:2223",'
        '"mnist-worker-2.team-a.svc:2223"]')
MASTER = '"master":["mnist-master-0.team-a.svc:2222"],"worker":["mnist-worker-0.team-a.svc:2222"]'
WORKERS = '"worker":["mnist-worker-0.team-a.svc:2222","mnist-worker-1.team-a.svc:2222"]'

# (shape, port, role, index, the TF_CONFIG Kubeflow writes for that pod, or None for none)
GOLDEN = [
    ("worker=1", 2222, "worker", 0, None),                                     # pod_test.go ns0/ns1
    ("chief=1", 2222, "chief", 0, None),
    ("ps=1,worker=1", 2222, "worker", 0, kf(PS1_W1, "worker", 0)),             # pod_test.go ns2
    ("ps=1,worker=1", 2222, "ps", 0, kf(PS1_W1, "ps", 0)),
    ("ps=1,worker=1,evaluator=1", 2222, "worker", 0, kf(EVAL, "worker", 0)),   # pod_test.go ns3
    ("ps=1,worker=1,evaluator=1", 2222, "evaluator", 0, kf(EVAL, "evaluator", 0)),
    ("worker=2", 2222, "worker", 1, kf(WORKERS, "worker", 1)),
    ("chief=1,ps=2,worker=2", 2222, "chief", 0, kf(PS_GANG, "chief", 0)),
    ("chief=1,ps=2,worker=2", 2222, "ps", 1, kf(PS_GANG, "ps", 1)),
    ("chief=1,ps=2,worker=2", 2222, "worker", 1, kf(PS_GANG, "worker", 1)),
    ("master=1,worker=1", 2222, "master", 0, kf(MASTER, "master", 0)),
    ("chief=1,ps=1,worker=3,evaluator=1", 2223, "worker", 2, kf(FULL, "worker", 2)),  # tfjob-port 2223
    ("chief=1,ps=1,worker=3,evaluator=1", 2223, "evaluator", 0, kf(FULL, "evaluator", 0)),
]


def ours(shape: str, port: int, role: str, index: int) -> str | None:
    """The TF_CONFIG trainhook injects into that pod: one Indexed Job per role named `<job>-<role>`, each
    admitted by the real mutation, then the pod the Job controller makes, admitted in turn."""
    counts = dict(part.split("=") for part in shape.split(","))
    annotations = {"trainhook.dev/port": str(port)}
    if len(counts) > 1:
        annotations["trainhook.dev/replicas"] = shape
    job = indexed_job(f"{JOB}-{role}", int(counts[role]), annotations=annotations,
                      labels={"trainhook.dev/framework": "tensorflow", "trainhook.dev/job-name": JOB,
                              "trainhook.dev/role": role})
    job = mutate("Job", "CREATE", job, NAMESPACE, SETTINGS).obj
    pod = mutate("Pod", "CREATE", pod_of_job(job, index), NAMESPACE, SETTINGS).obj
    values = [e["value"] for e in pod["spec"]["containers"][0]["env"] if e["name"] == "TF_CONFIG"]
    assert len(values) <= 1
    return values[0] if values else None


def split_address(address: str) -> tuple[str, str, str]:
    """(hostname, domain, port) of `host.domain:port`."""
    name, _, port = address.rpartition(":")
    host, _, domain = name.partition(".")
    return host, domain, port


@pytest.mark.parametrize("shape,port,role,index,golden", GOLDEN,
                         ids=[f"{g[0]} {g[2]}-{g[3]}" for g in GOLDEN])
def test_tf_config_matches_kubeflows_field_by_field(shape, port, role, index, golden):
    mine = ours(shape, port, role, index)
    if golden is None:
        assert mine is None, "Kubeflow sets no TF_CONFIG for a job of one replica"
        return
    assert mine is not None
    theirs, got = json.loads(golden), json.loads(mine)
    assert list(got) == list(theirs) == ["cluster", "task", "environment"]
    assert list(got["cluster"]) == list(theirs["cluster"]), "the same roles, in the same (sorted) order"
    for job_role, addresses in theirs["cluster"].items():
        assert len(got["cluster"][job_role]) == len(addresses), job_role
        for i, (kf_address, our_address) in enumerate(zip(addresses, got["cluster"][job_role])):
            kf_host, kf_domain, kf_port = split_address(kf_address)
            our_host, our_domain, our_port = split_address(our_address)
            assert our_host == kf_host == f"{JOB}-{job_role}-{i}", "Kubeflow's pod names are our hostnames"
            assert our_port == kf_port == str(port)
            assert (kf_domain, our_domain) == (KF_DOMAIN, OUR_DOMAIN), "the one difference: the domain part"
    assert got["task"] == theirs["task"] and list(got["task"]) == ["type", "index"]
    assert isinstance(got["task"]["index"], int)
    assert got["environment"] == theirs["environment"] == "cloud"
    # And the serialization itself (compact, key order) is Kubeflow's, byte for byte once the domain is mapped.
    assert mine.replace(f".{OUR_DOMAIN}:", f".{KF_DOMAIN}:") == golden


def test_a_single_statefulset_differs_from_kubeflow_only_in_its_pod_names():
    """One StatefulSet `mnist` of 2 workers: the cluster Kubeflow writes for 2 workers, but the hostnames are
    the StatefulSet's pod names (`mnist-0`), which Kubernetes fixes, where Kubeflow's are `mnist-worker-0`."""
    sts = mutate("StatefulSet", "CREATE", statefulset(JOB, 2, labels={"trainhook.dev/framework": "tensorflow"}),
                 NAMESPACE, SETTINGS).obj
    pod = mutate("Pod", "CREATE", pod_of_statefulset(sts, 1), NAMESPACE, SETTINGS).obj
    mine = next(e["value"] for e in pod["spec"]["containers"][0]["env"] if e["name"] == "TF_CONFIG")
    expected = kf(WORKERS, "worker", 1).replace("mnist-worker-", "mnist-").replace(f".{KF_DOMAIN}:", f".{JOB}:")
    assert mine == expected
