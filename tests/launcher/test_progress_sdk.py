"""The SDK's progress helpers (trainhook/sdk/progress.py) write what rank 0's launcher reads (launcher/progress.py):
report_progress's lines through the launcher's own reader and normalizer, only on global rank 0 and only in a gang;
the transformers callback's reports from a trainer's state; and the SDK imports without transformers."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from trainhook.launcher.progress import ProgressFile, normalize
from trainhook.sdk import progress as helpers


@pytest.fixture
def progress_file(tmp_path, monkeypatch):
    path = tmp_path / "progress.jsonl"
    monkeypatch.setenv("TRAINHOOK_PROGRESS_FILE", str(path))
    monkeypatch.delenv("RANK", raising=False)
    return path


def test_a_report_is_a_line_the_launcher_reads_and_normalizes(progress_file):
    reader = ProgressFile(str(progress_file))
    assert helpers.report_progress(step=5, total_steps=20, epoch=0.25, loss=0.5, lr=3e-4, note="text",
                                   nan=float("nan"), flag=True)
    assert normalize(reader.newest()) == {"percent": 25.0, "step": 5, "totalSteps": 20, "epoch": 0.25,
                                          "metrics": {"loss": 0.5, "lr": 0.0003}}


def test_only_global_rank_0_in_a_gang_reports_and_a_bad_file_never_raises(progress_file, monkeypatch, tmp_path):
    monkeypatch.setenv("RANK", "3")
    assert not helpers.report_progress(step=1)
    monkeypatch.setenv("RANK", "0")
    assert helpers.report_progress(step=1)
    monkeypatch.setenv("TRAINHOOK_PROGRESS_FILE", str(tmp_path / "no" / "such" / "dir" / "p.jsonl"))
    assert not helpers.report_progress(step=2)
    monkeypatch.delenv("TRAINHOOK_PROGRESS_FILE")
    assert not helpers.report_progress(step=3)
    assert progress_file.read_text().count("\n") == 1


def test_the_callback_reports_each_log_of_the_main_process(progress_file):
    reader = ProgressFile(str(progress_file))
    state = SimpleNamespace(is_world_process_zero=True, global_step=40, max_steps=200, epoch=1.5)
    reporter = helpers._Reporter()
    reporter.on_log(None, state, None, logs={"loss": 0.25, "learning_rate": 1e-4, "epoch": 1.5, "total_flos": 9.0})
    assert normalize(reader.newest()) == {"percent": 20.0, "step": 40, "totalSteps": 200, "epoch": 1.5,
                                          "metrics": {"loss": 0.25, "learning_rate": 0.0001}}
    reporter.on_log(None, SimpleNamespace(**{**vars(state), "is_world_process_zero": False}), None, logs={})
    assert reader.newest() is None  # another process's log: nothing written
    reporter.on_train_end(None, SimpleNamespace(**{**vars(state), "global_step": 200}), None)
    assert normalize(reader.newest())["percent"] == 100.0


def test_the_sdk_imports_without_transformers_and_the_callback_says_what_it_needs():
    code = ("import sys, trainhook.sdk, trainhook.sdk.progress\n"
            "assert 'transformers' not in sys.modules\n"
            "try:\n    from trainhook.sdk.progress import ProgressCallback\n"
            "except ImportError as e:\n    print('needs:', e)\n"
            "else:\n    import transformers\n    print('callback:', issubclass(ProgressCallback, "
            "transformers.TrainerCallback))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() in (
        "needs: trainhook.sdk.progress.ProgressCallback is a transformers.TrainerCallback: install transformers, or "
        "call report_progress(...) yourself", "callback: True")
