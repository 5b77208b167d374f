"""A training's progress file and rank 0's forwarder (launcher/progress.py, docs/use/progress.md): what a report may
say and how it is bounded, how the file is read as it grows, and how often the newest report is sent."""

from __future__ import annotations

import json
import os
import re

import pytest

from trainhook.gang import keys
from trainhook.launcher import progress
from trainhook.launcher.progress import (MAX_METRICS, MAX_READ, MIN_INTERVAL, Forwarder, ProgressFile, eta,
                                         label_value, normalize, summary)


def test_a_report_is_normalized_with_percent_computed_and_other_numbers_taken_as_metrics():
    detail = normalize({"step": 420, "total_steps": 1000, "epoch": 1.3, "loss": 0.5123456789, "name": "x",
                        "flag": True, "metrics": {"acc": 0.9, "bad name!": 1}}, "2026-01-01T00:00:00Z")
    assert detail == {"percent": 42.0, "step": 420, "totalSteps": 1000, "epoch": 1.3,
                      "metrics": {"loss": 0.512346, "acc": 0.9}, "time": "2026-01-01T00:00:00Z"}
    assert summary(detail) == "42% (step 420/1000, epoch 1.3), loss=0.512346 acc=0.9"
    assert label_value(detail) == "42pct"


def test_trainer_v2_names_are_read_and_the_percent_is_kept_within_0_and_100():
    detail = normalize({"progressPercentage": 180, "estimatedRemainingSeconds": 310})
    assert detail == {"percent": 100.0, "etaSeconds": 310}
    assert summary(detail) == "100%, about 5m10s left"
    assert label_value(normalize({"step": 7})) == "step-7"
    assert label_value(normalize({"epoch": 2.5})) == "epoch-2.5"
    assert label_value(normalize({"loss": 1.0})) == ""


@pytest.mark.parametrize("raw, fragment", [
    ([1, 2], "a progress report is a JSON object"),
    ({"step": "ten"}, "step='ten': a finite number is required"),
    ({"step": -1}, "step=-1: a number from 0 is required"),
    ({"epoch": float("nan")}, "epoch='nan': a finite number is required"),
    ({"metrics": [1]}, "metrics: an object of names to numbers"),
    ({"note": "only text"}, "no step, percent, epoch or numeric metric"),
    ({"step": 10 ** 20}, "step=100000000000000000000: a number below 1e+15 is required"),
])
def test_a_report_that_cannot_be_read_is_refused_naming_the_field(raw, fragment):
    with pytest.raises(ValueError) as refused:
        normalize(raw)
    assert fragment in str(refused.value)


@pytest.mark.parametrize("raw", [{"step": 10 ** 15 - 1}, {"epoch": 99999999999999.99}, {"epoch": 1e-9},
                                 {"percent": 12.345}, {"step": 0}])
def test_the_label_is_always_a_valid_label_value(raw):
    value = label_value(normalize(raw))
    assert re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?", value), value


def test_a_report_is_bounded_in_metrics_and_in_its_line():
    detail = normalize({f"m{i}": i for i in range(100)} | {"x" * 65: 1})
    assert len(detail["metrics"]) == MAX_METRICS and "x" * 65 not in detail["metrics"]
    text = summary(normalize({"step": 1, "metrics": {f"metric_{'n' * 50}_{i}": 1.0 for i in range(16)}}))
    assert len(text) == 256 and text.endswith("...")


def test_the_file_is_read_as_it_grows_newest_complete_line_first(tmp_path):
    path = tmp_path / "p.jsonl"
    reader = ProgressFile(str(path))
    assert reader.newest() is None  # not written yet
    with open(path, "a") as f:
        f.write('{"step": 1}\n{"step": 2}\n{"step": 3')  # the last line is still being written
    assert reader.newest() == {"step": 2}
    assert reader.newest() is None  # nothing new
    with open(path, "a") as f:
        f.write('}\nnot json\n')
    assert reader.newest() == {"step": 3}  # the completed line; the garbage after it is said, not taken
    assert "is not JSON" in reader.problem
    with open(path, "a") as f:  # nested past json's recursion limit: said the same way, not a RecursionError
        f.write('[' * 5000 + '\n')
    assert reader.newest() is None and "is not JSON" in reader.problem
    path.write_text('{"step": 9}\n')  # replaced (a new attempt truncating it)
    assert reader.newest() == {"step": 9}


def test_a_file_that_grew_a_lot_is_read_from_its_newest_bytes_only(tmp_path):
    path = tmp_path / "p.jsonl"
    lines = [json.dumps({"step": i, "pad": "x" * 100}) + "\n" for i in range(5000)]
    path.write_text("".join(lines))
    assert os.path.getsize(path) > MAX_READ
    reader = ProgressFile(str(path))
    assert reader.newest()["step"] == 4999
    assert reader.offset == os.path.getsize(path)


def test_the_remaining_time_is_estimated_from_the_rate_and_restarts_with_the_step():
    first = eta({"step": 100, "totalSteps": 1000}, None, now=10.0)
    assert first == (10.0, 100)
    later = {"step": 200, "totalSteps": 1000}
    assert eta(later, first, now=20.0) == first and later["etaSeconds"] == 80
    given = {"step": 300, "totalSteps": 1000, "etaSeconds": 5}
    eta(given, first, now=30.0)
    assert given["etaSeconds"] == 5  # the training's own estimate wins
    assert eta({"step": 3, "totalSteps": 1000}, first, now=40.0) == (40.0, 3)  # a gang restart: measured afresh
    done = {"step": 1000, "totalSteps": 1000}
    eta(done, first, now=50.0)
    assert "etaSeconds" not in done  # nothing left: no "about 0s left"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_newest_report_is_sent_at_most_once_per_interval_and_the_last_on_stop(tmp_path):
    path, clock, sent = tmp_path / "p.jsonl", Clock(), []
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.now += seconds

    forwarder = Forwarder(str(path), sent.append, interval=1, clock=clock, stamp=lambda: "T", log=lambda _: None,
                          sleep=sleep)
    assert forwarder.interval == MIN_INTERVAL  # never faster than the floor
    with open(path, "a") as f:
        f.write('{"step": 1, "total_steps": 10}\n')
        f.flush()
        forwarder.look()
        assert [d["step"] for d in sent] == [1]
        for step in (2, 3, 4):
            clock.now += 1
            f.write(json.dumps({"step": step, "total_steps": 10}) + "\n")
            f.flush()
            forwarder.look()
        assert [d["step"] for d in sent] == [1]  # within the interval: kept, not sent
        clock.now = MIN_INTERVAL
        forwarder.look()
        assert [d["step"] for d in sent] == [1, 4]  # only the newest of what came in between
        # 3 steps in 3 s, 6 to go
        assert sent[-1]["etaSeconds"] == 6 and sent[-1]["time"] == "T"
        f.write('{"step": 5, "total_steps": 10}\n')
    clock.now += 2
    forwarder.stop()
    assert [d["step"] for d in sent] == [1, 4, 5]
    assert slept == [MIN_INTERVAL - 2]  # the last report waits for the notary's floor, no longer


def test_a_failing_send_is_said_once_and_never_raises(tmp_path):
    path, said = tmp_path / "p.jsonl", []

    def refuse(detail: dict) -> None:
        raise OSError("the notary is not reachable")

    path.write_text('{"step": 1}\n')
    forwarder = Forwarder(str(path), refuse, clock=Clock(), log=said.append)
    forwarder.look()
    path.write_text('{"step": 2}\n{"step": "x"}\n')
    forwarder.look()
    forwarder.stop()
    assert said.count("progress not forwarded: the notary is not reachable") == 1
    assert any("left out: step='x'" in line for line in said)


def test_rank_0s_training_gets_the_file_in_its_environment_unless_it_named_one(tmp_path):
    env: dict[str, str] = {}
    forwarder = progress.watch(env, lambda detail: None)
    try:
        assert env[keys.TH_PROGRESS_FILE].endswith("progress.jsonl")
        assert os.path.isdir(os.path.dirname(env[keys.TH_PROGRESS_FILE]))
    finally:
        progress.stop(forwarder)
    mine = str(tmp_path / "mine.jsonl")
    assert progress.progress_file({keys.TH_PROGRESS_FILE: mine}) == mine
    assert progress.interval_from({keys.TH_PROGRESS_INTERVAL: "30"}) == 30.0
    assert progress.interval_from({keys.TH_PROGRESS_INTERVAL: "1"}) == MIN_INTERVAL
