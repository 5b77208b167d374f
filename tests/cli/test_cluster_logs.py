"""What `trainhook logs` and the SDK's `get_job_logs` make of a kubelet's answers (trainhook/cluster/logs.py).

A v1.20 kubelet answers a log request for a container being removed with a 200 whose body is one line of its own
in place of the log. Both lines here were seen on the node (tests/e2e/test_e2e_inspect.py's SDK test read the second
as sdkpy-0's log in a fresh-clone CI run, while the finished gang's scale to zero removed the container). The node
cannot be made to answer either at will, so the two reads read_pod_log makes are given here: the log's lines and
the pod as the API server would return it."""

from __future__ import annotations

import pytest

from trainhook.cluster.logs import KUBELET_LOST, read_pod_log

RUNNING = {"metadata": {"name": "g-0"}, "status": {"containerStatuses": [
    {"name": "pytorch", "state": {"running": {"startedAt": "2026-11-27T05:59:00Z"}}}]}}
DELETING = {**RUNNING, "metadata": {"name": "g-0", "deletionTimestamp": "2026-11-27T06:00:00Z"}}
GONE_LINES = [
    "unable to retrieve container logs for containerd://0123abcd",
    'failed to try resolving symlinks in path "/var/log/pods/default_g-0_9e3f/pytorch/0.log": lstat '
    "/var/log/pods/default_g-0_9e3f/pytorch/0.log: no such file or directory",
]


class Answers:
    """The two reads read_pod_log makes of a Cluster, answered as given."""

    def __init__(self, lines: list[str], pod: dict | None):
        self.lines, self.pod = lines, pod

    def log_lines(self, pod: str, container: str, follow: bool = False, tail: int | None = None):
        yield from self.lines

    def read_pod(self, name: str) -> dict | None:
        return self.pod


@pytest.mark.parametrize("line", GONE_LINES)
@pytest.mark.parametrize("pod", [DELETING, None], ids=["deleting", "deleted"])
def test_the_kubelets_line_for_a_container_being_removed_is_a_missed_log_not_the_log(line, pod):
    emitted: list[str] = []
    assert read_pod_log(Answers([line], pod), RUNNING, "pytorch", False, None, emitted.append) is False
    assert emitted == []  # the reader takes the lines kept with the outcome instead


@pytest.mark.parametrize("line", GONE_LINES)
def test_the_same_line_from_a_pod_that_stays_is_printed_as_its_log(line):
    """A pod not being deleted keeps its answer: whatever it says is what the user sees."""
    emitted: list[str] = []
    assert read_pod_log(Answers([line, "more"], RUNNING), RUNNING, "pytorch", False, None, emitted.append) is True
    assert emitted == [line, "more"]


def test_a_log_that_merely_contains_the_words_later_is_the_log():
    lines = ["step 1", GONE_LINES[1]]
    emitted: list[str] = []
    assert read_pod_log(Answers(lines, DELETING), RUNNING, "pytorch", False, None, emitted.append) is True
    assert emitted == lines


def test_the_lost_line_ending_a_followed_stream_is_dropped_for_a_pod_being_removed():
    emitted: list[str] = []
    lines = ["sdk rank 0 of 2", f"{KUBELET_LOST} \"0123abcd\": not found"]
    assert read_pod_log(Answers(lines, DELETING), RUNNING, "pytorch", True, None, emitted.append) is True
    assert emitted == ["sdk rank 0 of 2"]
