"""A finished gang can still be inspected, on the real node (issue 25 item 2): the user's images (nothing of
trainhook in them) under the launcher the webhook delivers; the outcome, the deciding pod and the last lines are
recorded by the notary, and the StatefulSet is scaled to zero, which deletes the pods and their logs.

- a gang that ends within a second of starting: `trainhook logs -f`, started before its containers run, still
  prints every pod's line;
- a failed gang: `status` names the rank, pod, exit code and attempt; once the pods are gone `logs` prints the
  failing rank's last lines (kept with the outcome), its traceback included;
- the SDK: `get_job_logs(follow=True)` right after `create_job` waits through PodInitializing and returns the
  function's output; `get_job_logs` after `wait_for_job` never fails on the scale to zero; a function job whose
  image has no `torchrun` fails naming it."""

from __future__ import annotations

import subprocess
import time

from e2e_gangs import NAMESPACE, delete_gang, pods_of, statefulset_gang
from e2e_helpers import REPO, wait_for

TRAINHOOK = str(REPO / ".venv" / "bin" / "trainhook")
QUICK = "e2e-quick"
FAILS = "e2e-fails"
FAILING = ("import os, sys\n"
           "rank = int(os.environ['RANK'])\n"
           "for i in range(50): print(f'rank {rank} step {i}')\n"
           "if rank == 1:\n"
           "    raise ValueError('bad batch 7 on rank 1')\n"
           "import time; time.sleep(30)\n")


def trainhook(node, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([TRAINHOOK, *args, "-n", NAMESPACE, "--kubeconfig", node.node.kubeconfig],
                          capture_output=True, text=True, timeout=timeout, env=node.env)


def follow(node, name: str) -> subprocess.Popen:
    return subprocess.Popen([TRAINHOOK, "logs", "-f", name, "-n", NAMESPACE, "--kubeconfig", node.node.kubeconfig],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=node.env)


def test_logs_f_started_before_a_gang_that_ends_within_a_second_prints_its_lines(node, release):
    delete_gang(node, QUICK)
    following = None
    try:
        node.apply(NAMESPACE, statefulset_gang(QUICK, node.images["torch"], ["python", "-c", "print('quick')"], 2))
        wait_for(lambda: len(pods_of(node, QUICK)) == 2, 60, "the gang's 2 pods to be created", interval=0.2)
        following = follow(node, QUICK)
        wait_for(lambda: not pods_of(node, QUICK), 120, "the finished gang's pods to be deleted by the scale to 0")
        out, err = following.communicate(timeout=60)
        print(out, err)
        assert following.returncode == 0, (out, err)
        for i in range(2):
            assert f"[{QUICK}-{i}] quick" in out.splitlines(), (out, err)
        status = trainhook(node, "status", QUICK)
        assert status.returncode == 0 and "Succeeded" in status.stdout, status
        assert f"(pytorch, worker=2)" in status.stdout and "no pods yet" not in status.stdout, status.stdout
    except BaseException:
        print(node.describe(NAMESPACE))
        raise
    finally:
        if following is not None and following.poll() is None:
            following.kill()
            following.communicate()
        delete_gang(node, QUICK, wait=False)


def test_a_failed_gang_shows_who_failed_and_its_last_lines_after_its_pods_are_gone(node, release):
    delete_gang(node, FAILS)
    try:
        node.apply(NAMESPACE, statefulset_gang(FAILS, node.images["torch"], ["python", "-c", FAILING], 2))
        wait_for(lambda: "Failed" in trainhook(node, "status", FAILS).stdout, 120, "the gang to fail", interval=1)
        wait_for(lambda: not pods_of(node, FAILS), 120, "the failed gang's pods to be deleted by the scale to 0")
        status = trainhook(node, "status", FAILS)
        print(status.stdout)
        assert status.returncode == 0, status
        lines = status.stdout.splitlines()
        assert lines[0].startswith(f"gang {FAILS} (pytorch, worker=2) in {NAMESPACE}: Failed"), status.stdout
        assert f"outcome: Failed, exit code 1, decided by rank 1 (pod {FAILS}-1), attempt 1" in lines, status.stdout
        assert any(line.startswith("started: 20") and "ended: 20" in line for line in lines), status.stdout
        assert "no pods yet" not in status.stdout

        logs = trainhook(node, "logs", FAILS)
        print(logs.stdout, logs.stderr)
        assert logs.returncode == 0, logs
        failing = [line for line in logs.stdout.splitlines() if line.startswith(f"[{FAILS}-1] ")]
        assert f"[{FAILS}-1] ValueError: bad batch 7 on rank 1" in failing, logs.stdout
        assert f"[{FAILS}-1] rank 1 step 49" in failing, logs.stdout
        assert "kept with the gang's outcome" in logs.stderr, logs.stderr
        assert f"[{FAILS}-0] rank 0 step 49" in logs.stdout.splitlines(), logs.stdout  # rank 0's are kept too

        listed = trainhook(node, "list")
        (row,) = [line.split() for line in listed.stdout.splitlines() if line.split()[:1] == [FAILS]]
        header = listed.stdout.splitlines()[0].split()
        assert row[2] == "worker=2" and row[header.index("OUTCOME")] == "Failed", listed.stdout
    except BaseException:
        print(node.describe(NAMESPACE))
        raise
    finally:
        delete_gang(node, FAILS, wait=False)


def sdk_train():
    import os
    print(f"sdk rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}", flush=True)


def test_the_sdk_follows_from_create_job_and_reads_logs_after_wait_for_job(node, release):
    from trainhook import JobFailed, TrainingClient

    client = TrainingClient(config_file=node.node.kubeconfig, namespace=NAMESPACE)
    for name in ("sdkpy", "sdk-notorch"):
        client.delete_job(name)
    wait_for(lambda: not pods_of_job(node, "sdkpy") and not pods_of_job(node, "sdk-notorch"), 60, "old pods gone")
    try:
        t0 = time.monotonic()
        client.create_job("sdkpy", func=sdk_train, num_workers=2, base_image=node.images["torch"],
                          resources_per_worker={"cpu": "100m", "memory": "1Gi"})
        logs = client.get_job_logs("sdkpy", follow=True)  # at once: the pods are not even scheduled yet
        print(f"followed in {time.monotonic() - t0:.1f}s: {logs}")
        assert "sdk rank 0 of 2" in logs.get("sdkpy-0", ""), logs
        assert client.wait_for_job("sdkpy", timeout=180, polling_interval=1).outcome == "Succeeded"
        after = client.get_job_logs("sdkpy")  # the scale to zero may be deleting the pods right now
        assert "sdk rank 0 of 2" in after.get("sdkpy-0", ""), after
        assert client.get_job("sdkpy").shape == "worker=2"

        client.create_job("sdk-notorch", func=sdk_train, num_workers=1, base_image=node.images["xgboost"],
                          resources_per_worker={"cpu": "100m", "memory": "1Gi"})
        try:
            client.wait_for_job("sdk-notorch", timeout=180, polling_interval=1)
            raise AssertionError("a function job without torchrun succeeded")
        except JobFailed as failed:
            record = failed.state.recorded
            assert record is not None and record.code == 127, failed.state
            assert "command not found: torchrun" in record.reason, record
    except BaseException:
        print(node.describe(NAMESPACE))
        raise
    finally:
        for name in ("sdkpy", "sdk-notorch"):
            client.delete_job(name)
        client.close()


def pods_of_job(node, name: str) -> list[str]:
    import json

    pods = json.loads(node.kubectl("get", "pods", "-n", NAMESPACE, "-l", f"trainhook.dev/job-name={name}", "-o",
                                   "json"))["items"]
    return [p["metadata"]["name"] for p in pods]
