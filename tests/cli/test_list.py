"""`trainhook list` and `status` with a gang's progress (trainhook/cluster/listing.py, status.py): columns AGE,
DURATION and PROGRESS, -A's NAMESPACE, -o wide|json|yaml, and --watch's rows for what changed. Pure, over the
objects the API server returns; the progress annotations are written by the notary's own writer
(webhook/notary/progress.py progress_patch), the outcome by the launcher's (tests/support/launcher_outcomes.py)."""

from __future__ import annotations

import datetime as dt
import json

import pytest
import yaml

from launcher_outcomes import decided
from trainhook.cluster.listing import format_gangs, human_duration, watch
from trainhook.cluster.status import format_status, gang_state
from trainhook.gang import keys
from trainhook.webhook.notary.progress import parse_progress, progress_patch

NOW = dt.datetime(2025, 1, 1, 1, 0, 0, tzinfo=dt.timezone.utc)


def pod(name: str, rank: int, phase: str = "Running", started: str = "2025-01-01T00:10:00Z") -> dict:
    return {"metadata": {"name": name, "labels": {keys.JOB_NAME: "g", keys.FRAMEWORK: "pytorch"},
                         "creationTimestamp": "2025-01-01T00:09:00Z"},
            "spec": {"containers": [{"name": "trainer", "env": [{"name": keys.TH_RANK, "value": str(rank)}]}]},
            "status": {"phase": phase, "startTime": started,
                       "containerStatuses": [{"name": "trainer", "ready": True, "restartCount": 0,
                                              "state": {"running": {}}}]}}


def sts(name: str = "g", report: dict | None = None, annotations: dict | None = None, labels: dict | None = None,
        created: str = "2025-01-01T00:00:00Z") -> dict:
    meta: dict = {"name": name, "creationTimestamp": created, "annotations": dict(annotations or {}),
                  "labels": {keys.FRAMEWORK: "pytorch", keys.JOB_NAME: name, **(labels or {})}}
    if report is not None:
        patch = progress_patch(parse_progress({"progress": report}))["metadata"]
        meta["annotations"].update(patch["annotations"])
        meta["labels"].update({k: v for k, v in patch["labels"].items() if v})
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta, "spec": {"replicas": 2}}


REPORT = {"step": 420, "totalSteps": 1000, "metrics": {"loss": 0.5, "lr": 0.0001}, "time": "2025-01-01T00:59:00Z"}


def running() -> object:
    return gang_state("g", "team-a", [sts(report=REPORT)], [pod("g-0", 0), pod("g-1", 1)])


def test_the_table_has_progress_duration_and_age_and_kubectls_short_times():
    assert format_gangs([running()], "table", NOW).splitlines() == [
        "NAME  FRAMEWORK  SHAPE     PODS  RESTARTS  OUTCOME  PROGRESS  DURATION  AGE",
        "g     pytorch    worker=2  2/2   0         Running  42%       50m       1h0m"]
    assert [human_duration(s) for s in (5, 200, 3000, 7500, 200000)] == ["5s", "3m20s", "50m", "2h5m", "2d7h"]
    assert format_gangs([], "table", NOW) == "no gangs"


def test_a_finished_gangs_duration_ends_at_its_recorded_end_and_its_last_report_stays():
    outcome = decided("g", size=2)
    finished = sts(report={**REPORT, "step": 1000}, annotations={**outcome.annotations(),
                                                                  keys.START_TIME: "2025-01-01T00:05:00Z"})
    state = gang_state("g", "team-a", [finished], [])
    ended = dt.datetime.strptime(outcome.time, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    [_, row] = format_gangs([state], "table", ended + dt.timedelta(days=3)).splitlines()
    assert row.split()[5:8] == ["Succeeded", "100%", human_duration((ended - dt.datetime(
        2025, 1, 1, 0, 5, tzinfo=dt.timezone.utc)).total_seconds())]


def test_all_namespaces_and_wide_add_their_columns():
    other = gang_state("h", "team-b", [sts("h", created="2025-01-01T00:59:30Z")], [])
    lines = format_gangs([running(), other], "wide", NOW, all_namespaces=True).splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "FRAMEWORK", "SHAPE", "PODS", "RESTARTS", "OUTCOME", "PROGRESS",
                                "DURATION", "AGE", "WORKLOADS", "METRICS", "DETAIL"]
    assert lines[1].split()[:2] == ["team-a", "g"] and lines[1].split()[-3:] == [
        "statefulset/g", "loss=0.5,lr=0.0001", "-"]
    assert lines[2].split()[:2] == ["team-b", "h"] and lines[2].split()[7:10] == ["-", "-", "30s"]


def test_json_and_yaml_carry_every_field_with_the_progress():
    text = format_gangs([running()], "json", NOW)
    [item] = json.loads(text)["items"]
    assert (item["namespace"], item["name"], item["outcome"], item["running"], item["durationSeconds"]) == (
        "team-a", "g", "Running", 2, 3000)
    assert item["progress"]["percent"] == 42.0 and item["progress"]["metrics"] == {"loss": 0.5, "lr": 0.0001}
    assert item["progress"]["summary"] == "42% (step 420/1000), loss=0.5 lr=0.0001"
    assert yaml.safe_load(format_gangs([running()], "yaml", NOW)) == json.loads(text)


def test_status_shows_the_progress_and_the_last_metrics():
    lines = format_status(running()).splitlines()
    assert lines[2:4] == ["progress: 42% (step 420/1000), loss=0.5 lr=0.0001 (reported 2025-01-01T00:59:00Z)",
                          "last metrics: loss=0.5 lr=0.0001"]
    assert not any(line.startswith("progress:") for line in format_status(
        gang_state("g", "ns", [sts()], [pod("g-0", 0)])).splitlines())


def test_watch_prints_the_table_then_a_row_for_each_gang_that_changed():
    looks = [[running()],
             [running()],  # nothing new (the clock moved: AGE and DURATION alone are not news)
             [gang_state("g", "team-a", [sts(report={**REPORT, "step": 500})], [pod("g-0", 0), pod("g-1", 1)]),
              gang_state("h", "team-a", [sts("h")], [])]]
    said: list[str] = []
    clock = iter([NOW + dt.timedelta(seconds=i) for i in range(3)])
    watch(lambda: looks.pop(0), said.append, "table", lambda: next(clock), lambda: bool(looks))
    assert said[0].splitlines()[0].startswith("NAME  FRAMEWORK")
    assert [line.split()[:1] + line.split()[6:7] for line in said[1:]] == [["g", "50%"], ["h", "-"]]
    said.clear()
    looks = [[running()], [running()]]
    watch(lambda: looks.pop(0), said.append, "json", lambda: NOW, lambda: bool(looks))
    assert [json.loads(line)["name"] for line in said] == ["g"]


def test_the_list_command_takes_kubectls_flags():
    from trainhook.cluster.commands import add_list_arguments
    import argparse

    parser = argparse.ArgumentParser()
    add_list_arguments(parser)
    args = parser.parse_args(["-A", "-l", "team=vision", "-o", "wide", "--watch", "-n", "x"])
    assert (args.all_namespaces, args.selector, args.output, args.watch, args.namespace) == (
        True, "team=vision", "wide", True, "x")
    with pytest.raises(SystemExit) as refused:
        parser.parse_args(["-o", "csv"])
    assert refused.value.code == 2
