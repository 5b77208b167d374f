"""Trainer v2's SDK surface on the real node (issue 34, section 2): a notebook's calls, with only the import
changed, train a function through `trainhook.TrainerClient` the way `trainhook.TrainingClient` (the v1 surface)
trains the same function, beside it, in the user's torch image (nothing of trainhook in it) under the launcher
the webhook delivers.

- `train(runtime=torch-distributed with the node's image, trainer=CustomTrainer(func, func_args, num_nodes=2,
  resources_per_node))` returns a Trainer-style name; `get_job_logs(name, follow=True)` right away streams node-0's
  lines (`func(**func_args)`: keyword arguments); `wait_for_job_status` returns the TrainJob `Complete`; the
  v1 gang of the same function (`create_job(func=...)`, called with no arguments) succeeds beside it;
- after the scale to zero: `get_job_logs` (the kept lines), `get_job` (Complete, 2 nodes), `list_jobs`,
  `get_job_events` (the StatefulSet's and the pods' events, pods gone);
- a function that fails on rank 1: `wait_for_job_status` raises RuntimeError (trainhook.JobFailed) with the exit
  code recorded, and `wait_for_job_status(status={"Failed"})` returns the TrainJob `Failed`;
- `delete_job` removes each gang; `get_job` then raises RuntimeError, as Trainer's does."""

from __future__ import annotations

import time

from e2e_gangs import NAMESPACE
from e2e_helpers import wait_for


def greet(greeting="v1"):
    """Shipped to every pod: v1 calls it with no arguments, v2 with func_args as keyword arguments."""
    import os
    print(f"sdk-trainer {greeting} rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}", flush=True)


def fail_on_rank_1(code=3):
    import os
    import sys
    print(f"sdk-trainer failing rank {os.environ['RANK']}", flush=True)
    if os.environ["RANK"] == "1":
        sys.exit(code)


def test_a_trainer_v2_notebook_trains_the_v1_function_on_the_node(node, release):
    from trainhook import CustomTrainer, JobFailed, KubernetesBackendConfig, TrainerClient, TrainingClient

    config = KubernetesBackendConfig(namespace=NAMESPACE, config_file=node.node.kubeconfig)
    client = TrainerClient(config)
    v1 = TrainingClient(config_file=node.node.kubeconfig, namespace=NAMESPACE)
    resources = {"cpu": "100m", "memory": "1Gi"}
    runtime = client.get_runtime("torch-distributed")
    runtime.trainer.image = node.images["torch"]  # the node's own image, never pulled
    names: list[str] = []
    v1.delete_job("sdk-v1")
    wait_for(lambda: not v1.get_job("sdk-v1").pods, 60, "the old v1 gang's pods to go")
    try:
        t0 = time.monotonic()
        name = client.train(runtime=runtime, trainer=CustomTrainer(
            func=greet, func_args={"greeting": "v2"}, num_nodes=2, resources_per_node=resources))
        names.append(name)
        assert len(name) == 12 and name[0].isalpha(), name
        v1.create_job("sdk-v1", func=greet, num_workers=2, base_image=node.images["torch"],
                      resources_per_worker=resources)
        followed = list(client.get_job_logs(name, follow=True))  # at once: the pods are not even scheduled yet
        print(f"followed in {time.monotonic() - t0:.1f}s: {followed}")
        assert "sdk-trainer v2 rank 0 of 2" in followed, followed

        job = client.wait_for_job_status(name, timeout=180, polling_interval=1)
        assert (job.status, job.num_nodes, job.runtime.name) == ("Complete", 2, "torch-distributed"), job
        assert v1.wait_for_job("sdk-v1", timeout=180, polling_interval=1).outcome == "Succeeded"
        assert "sdk-trainer v1 rank 0 of 2" in v1.get_job_logs("sdk-v1").get("sdk-v1-0", ""), "v1's rank 0"

        wait_for(lambda: not client.get_job(name).steps, 60, "the finished gang's pods to go (scale to zero)")
        after = list(client.get_job_logs(name))  # the pods are gone: the lines kept with the outcome
        assert "sdk-trainer v2 rank 0 of 2" in after, after
        assert client.get_job(name).status == "Complete"
        assert {j.name: j.status for j in client.list_jobs()}.get(name) == "Complete"
        events = client.get_job_events(name)
        print("\n".join(f"{e.event_time} {e.involved_object_kind}/{e.involved_object_name} {e.reason}: {e.message}"
                        for e in events))
        assert any(e.involved_object_kind == "StatefulSet" and e.reason == "SuccessfulCreate" for e in events)
        assert any(e.involved_object_kind == "Pod" and e.involved_object_name == f"{name}-0"
                   and e.reason == "Started" for e in events), events

        failing = client.train(runtime=runtime, trainer=CustomTrainer(func=fail_on_rank_1, num_nodes=2,
                                                                      resources_per_node=resources))
        names.append(failing)
        try:
            client.wait_for_job_status(failing, timeout=180, polling_interval=1)
            raise AssertionError("a gang whose rank 1 exits 3 completed")
        except JobFailed as failed:  # a RuntimeError, as Trainer raises
            assert failed.state.recorded is not None and failed.state.recorded.code == 3, failed.state
        assert client.wait_for_job_status(failing, status={"Failed"}, timeout=30).status == "Failed"

        for each in names:
            assert client.delete_job(each) is None
        wait_for(lambda: not any(j.name in names for j in client.list_jobs()), 60, "the gangs to be deleted")
        try:
            client.get_job(name)
            raise AssertionError("get_job found a deleted job")
        except RuntimeError as gone:
            assert f"Failed to get TrainJob: {NAMESPACE}/{name}" in str(gone)
        names.clear()
    except BaseException:
        print(node.describe(NAMESPACE))
        # Each gang's launchers say where it stands (a CI run once found one Running at 180 s).
        pods = [p.removeprefix("pod/") for p in node.kubectl("get", "pods", "-n", NAMESPACE, "-o", "name",
                                                               check=False).split()]
        for pod in (p for p in pods if any(p.startswith(f"{each}-") for each in names)):
            print(f"--- {pod}\n{node.logs(NAMESPACE, pod)}\n--- {pod}'s processes\n{node.processes(NAMESPACE, pod)}")
        raise
    finally:
        for each in names:
            v1.delete_job(each)  # no error when already gone
        v1.delete_job("sdk-v1")
        client.close()
        v1.close()
