"""Report a training's progress from inside it (docs/use/progress.md): one JSON line appended to the file rank 0's
launcher names in TRAINHOOK_PROGRESS_FILE, which it forwards through the notary to the gang's workload.

Nothing here is needed: a training in any language may append `{"step": 10, "total_steps": 100, "loss": 0.5}` to
that file itself. This is the convenience for Python: `report_progress(...)`, standard library only (copy it into
an image without trainhook if you like), and `ProgressCallback`, a Hugging Face `transformers.TrainerCallback`
built on first use, so importing this module (or the SDK) never needs transformers.

Only global rank 0 reports (RANK, as torchrun and the webhook set it): other processes' calls do nothing, and so
does a call outside a trainhook gang (no TRAINHOOK_PROGRESS_FILE). A call never raises for an unwritable file:
progress must never stop a training.
"""

from __future__ import annotations

import importlib
import json
import math
import os
from typing import Any

PROGRESS_FILE = "TRAINHOOK_PROGRESS_FILE"  # trainhook.gang.keys.TH_PROGRESS_FILE (not imported: copyable alone)


def _reporting() -> str:
    """The file to append to, or "" when this process does not report (not rank 0, or not in a gang)."""
    if os.environ.get("RANK", "0").strip() not in ("", "0"):
        return ""
    return os.environ.get(PROGRESS_FILE, "").strip()


def report_progress(step: int | None = None, total_steps: int | None = None, epoch: float | None = None,
                    percent: float | None = None, eta_seconds: float | None = None, **metrics: Any) -> bool:
    """Append one report; True when it was written. `metrics` are numbers by name (loss=0.5, lr=3e-4); other
    values, and numbers that are not finite, are left out. The launcher computes `percent` from `step` and
    `total_steps`, and a remaining time from the rate, when they are not given."""
    path = _reporting()
    if not path:
        return False
    report: dict[str, Any] = {}
    for name, value in (("step", step), ("total_steps", total_steps), ("epoch", epoch), ("percent", percent),
                        ("eta_seconds", eta_seconds)):
        if value is not None:
            report[name] = value
    numbers = {k: float(v) for k, v in metrics.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    if numbers:
        report["metrics"] = numbers
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(report, allow_nan=False) + "\n")
    except (OSError, ValueError):
        return False
    return True


class _Reporter:
    """What ProgressCallback does, apart from transformers' base class: a report at every log and at the end."""

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if getattr(state, "is_world_process_zero", True):
            self._report(state, logs or {})

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if getattr(state, "is_world_process_zero", True):
            self._report(state, {})

    @staticmethod
    def _report(state: Any, logs: dict) -> None:
        metrics = {k: v for k, v in logs.items() if k not in ("epoch", "step", "total_flos")}
        total = getattr(state, "max_steps", None)
        report_progress(step=getattr(state, "global_step", None), total_steps=total if total and total > 0 else None,
                        epoch=getattr(state, "epoch", None), **metrics)


def __getattr__(name: str) -> Any:
    """`ProgressCallback`: a transformers.TrainerCallback, made when first asked for (transformers is needed then,
    and only then): `Trainer(..., callbacks=[ProgressCallback()])`."""
    if name != "ProgressCallback":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:  # by name: transformers is no dependency of trainhook, and mypy need not know it
        base = importlib.import_module("transformers").TrainerCallback
    except ImportError as e:
        raise ImportError("trainhook.sdk.progress.ProgressCallback is a transformers.TrainerCallback: install "
                          "transformers, or call report_progress(...) yourself") from e
    callback = type("ProgressCallback", (_Reporter, base), {
        "__doc__": "Reports each log (step, max_steps, epoch, loss, learning_rate, ...) to TRAINHOOK_PROGRESS_FILE.",
        "__module__": __name__})
    globals()["ProgressCallback"] = callback
    return callback
