"""Plot bench/results/admission.json into docs/performance-admission.png (throughput and latency)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SERIES = (("yardstick", "yardstick (parse, allow)"), ("gang2", "trainhook, 2-pod gang"),
          ("gang1024", "trainhook, 1024-pod gang"))


def main() -> None:
    results = json.loads((ROOT / "bench" / "results" / "admission.json").read_text())
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = [label for _, label in SERIES]
    left.bar(names, [results[key]["throughput_rps"] for key, _ in SERIES], color=["grey", "C0", "C1"])
    left.set_ylabel("reviews / s at saturation (one server process)")
    left.tick_params(axis="x", labelrotation=12)
    for key, label in SERIES:
        fixed = results[key]["fixed"]
        rates = [f["rate"] for f in fixed]
        right.plot(rates, [f["p50_ms"] for f in fixed], marker="o", label=f"{label} p50")
        right.plot(rates, [f["p99_ms"] for f in fixed], marker="x", linestyle="--", label=f"{label} p99")
    right.set_xlabel("offered rate (reviews / s)")
    right.set_ylabel("latency (ms)")
    right.set_yscale("log")
    right.legend(fontsize=7)
    fig.suptitle("Admission over TLS with keep-alive")
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / "performance-admission.png", dpi=110)


if __name__ == "__main__":
    main()
