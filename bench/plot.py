"""Plot the benchmark results: bench/results/admission.json into docs/develop/performance-admission.png (throughput,
server CPU per review, latency); bench/results/gang_start.json, when present, into
docs/develop/performance-gang-start.png; and the node's gang starts at scale (bench/node_start_scale.py's
node_start_scale_<size>.json), when present, into docs/develop/performance-gang-scale.png; and the gang against the
real central parts at 100 to 10,000 members (bench/gang_scale_sim.py's gang-scale-<N>.json), when present, into
docs/develop/performance-scale-sim.png."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs" / "develop"
SERIES = (("yardstick", "yardstick (parse, allow)"), ("gang2", "trainhook, 2-pod gang"),
          ("gang1024", "trainhook, 1024-pod gang"))
COLORS = ("grey", "C0", "C1")


def plot_admission(results: dict) -> None:
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.2))
    names = [label.replace(", ", ",\n") for _, label in SERIES]
    throughput = [results[key]["throughput_rps"] for key, _ in SERIES]
    low = [t - results[key]["throughput_min_max"][0] for t, (key, _) in zip(throughput, SERIES)]
    high = [results[key]["throughput_min_max"][1] - t for t, (key, _) in zip(throughput, SERIES)]
    left.bar(names, throughput, yerr=[low, high], capsize=4, color=COLORS)
    left.set_ylabel("reviews / s at saturation (median, min-max)")
    left.set_title("throughput, one server process", fontsize=10)
    cpu = [results[key]["server_cpu_us_per_review"] for key, _ in SERIES]
    middle.bar(names, cpu, color=COLORS)
    for i, value in enumerate(cpu):
        middle.annotate(f"{value:.0f} µs\n×{value / cpu[0]:.1f}", (i, value), ha="center", va="bottom", fontsize=8)
    middle.set_ylabel("server CPU time per review (µs)")
    middle.set_ylim(0, max(cpu) * 1.25)
    middle.set_title("cost: the server's own CPU time", fontsize=10)
    for (key, label), color in zip(SERIES, COLORS):
        fixed = results[key]["fixed"]
        rates = [f["rate"] for f in fixed]
        right.plot(rates, [f["p50_ms"] for f in fixed], marker="o", color=color, label=f"{label} p50")
        right.plot(rates, [f["p99_ms"] for f in fixed], marker="x", linestyle="--", color=color, label=f"{label} p99")
    right.set_xlabel("offered rate (reviews / s)")
    right.set_ylabel("latency (ms), median of repetitions")
    right.set_xscale("log")
    right.set_xticks(rates, [str(r) for r in rates])
    right.minorticks_off()
    right.set_yscale("log")
    right.legend(fontsize=7)
    right.set_title("latency at fixed rates", fontsize=10)
    machine = results["machine"]
    fig.suptitle(f"Admission over TLS with keep-alive ({machine['cores']} cores: server pinned to one, load generator "
                 f"to the other; Python {machine['python']}, aiohttp {machine['aiohttp']}; "
                 f"{results['repeat']}× {results['seconds']:g} s per figure)", fontsize=10)
    fig.tight_layout()
    fig.savefig(DOCS / "performance-admission.png", dpi=110)


def plot_gang_start(results: dict) -> None:
    runs = results["runs"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1, 1.4]})
    labels = {"torchrun": "torchrun by hand", "trainhook": "trainhook local"}
    data = [[r["gang_start_s"] for r in runs[name]] for name in labels]
    left.boxplot(data, showmeans=False)
    left.set_xticks([1, 2], list(labels.values()))
    for i, values in enumerate(data, start=1):
        left.scatter([i] * len(values), values, s=12, color="k", zorder=3)
    left.set_ylabel("s, last pod started → every rank in its loop")
    left.set_title(f"{results['pods']} pods, {len(data[0])} runs each", fontsize=10)
    # Where the time goes, medians: pods started -> torch imported -> process group -> in the loop.
    stages = (("last_main_start_s", "last training container started (trainhook: after its gang wait)"),
              ("last_import_s", "torch imported (last rank)"), ("last_process_group_s", "process group formed"),
              ("gang_start_s", "every rank in its loop"))
    for row, name in enumerate(labels):
        previous = 0.0
        for (key, stage), color in zip(stages, ("C3", "C2", "C0", "C1")):
            value = statistics.median(r[key] for r in runs[name])
            width = max(0.0, value - previous)
            right.barh(row, width, left=previous, color=color, label=stage if row == 1 else None)
            previous = max(previous, value)
    right.set_yticks([0, 1], list(labels.values()))
    right.set_xlabel("s after the last pod's start (medians)")
    right.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    right.set_title("where the time goes", fontsize=10)
    machine = results["machine"]
    fig.suptitle(f"Gang start ({machine['cores']} cores shared by every pod; torch {machine['torch']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(DOCS / "performance-gang-start.png", dpi=110)


SCALE_VARIANTS = (("by-hand", "hand-wired", "grey"), ("configmap", "trainhook, launcher ConfigMap", "C0"),
                  ("init", "trainhook, gang-wait init container", "C1"))


def plot_gang_scale(rounds: list[dict]) -> None:
    """Start time (apply -> the last rank printed) and DNS queries per gang against the gang's size, per
    delivery path: medians with min-max bars, every round as a dot, so the spread of a loaded machine shows."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.4))
    sizes = sorted({r["size"] for r in rounds if "failed" not in r})
    for variant, label, color in SCALE_VARIANTS:
        for axis, key in ((left, "to_last_rank_s"), (right, "dns_queries")):
            if variant == "by-hand" and key == "dns_queries":
                continue  # the hand-wired pods resolve nothing before they print
            xs, medians, lows, highs = [], [], [], []
            for size in sizes:
                values = [r[key] for r in rounds if r["size"] == size and r["variant"] == variant and "failed" not in r]
                if not values:
                    continue
                median = statistics.median(values)
                xs.append(size)
                medians.append(median)
                lows.append(median - min(values))
                highs.append(max(values) - median)
                axis.scatter([size] * len(values), values, s=8, color=color, alpha=0.5)
            axis.errorbar(xs, medians, yerr=[lows, highs], marker="o", capsize=3, color=color, label=label)
    left.set_xlabel("pods in the gang")
    left.set_ylabel("s, kubectl apply -> the last rank printed")
    left.set_title("start time, bare ranks (median, min-max, each round)", fontsize=10)
    right.set_xlabel("pods in the gang")
    right.set_ylabel("DNS queries naming the gang")
    right.set_title("cluster DNS queries per gang (linear in the pods)", fontsize=10)
    for axis in (left, right):
        axis.set_xticks(sizes, [str(s) for s in sizes])
        axis.legend(fontsize=8)
    loads = [r["load_1m"] for r in rounds if "load_1m" in r]
    fig.suptitle(f"Gang start on one 2-core node (v1.20 kubelet), trainhook against hand-wired pods; the machine's "
                 f"1-minute load during the rounds: {min(loads):.0f}-{max(loads):.0f}", fontsize=10)
    fig.tight_layout()
    fig.savefig(DOCS / "performance-gang-scale.png", dpi=110)


def plot_scale_sim(runs: list[dict]) -> None:
    """Issue 32's figures against the gang's size, each panel with its goal where the issue set one."""
    runs = sorted(runs, key=lambda r: r["members"])
    sizes = [r["members"] for r in runs]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    # issue 32's goals at 10,000 members on this machine, drawn as crosses at 10,000 in the series' colors
    goals = {"credential_s": 20.0, "barrier_s": 5.0, "restart_s": 10.0, "notary_cpu_ms_per_member": 1.0,
             "api_calls_per_member": 0.01, "coordinator_rss_mb": 300.0}
    panels = (
        (axes[0], "seconds", (("credential_s", "first to last credential", "C0"),
                              ("barrier_s", "last join to every member started", "C1"),
                              ("restart_s", "in-place restart round", "C2"),
                              ("outcome_s", "rank 0's exit to the outcome recorded", "C3"))),
        (axes[1], "CPU ms per member", (("notary_cpu_ms_per_member", "notary (webhook process), credentials", "C0"),
                                        ("coordinator_cpu_ms_per_member", "coordinator process, whole run", "C1"),
                                        ("admission_cpu_ms_per_pod", "admission, per pod", "C4"))),
        (axes[2], "per member / MB", (("api_calls_per_member", "notary's API calls per member", "C0"),
                                      ("coordinator_rss_mb", "coordinator RSS (MB)", "C1"))),
    )
    for axis, unit, series in panels:
        for key, label, color in series:  # a run stopped early has some figures only
            points = [(r["members"], r[key]) for r in runs if key in r]
            axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=color, label=label)
            if key in goals:
                axis.plot([10000], [goals[key]], marker="x", markersize=9, linestyle="none", color=color)
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xticks(sizes, [f"{s:,}" for s in sizes])
        axis.minorticks_off()
        axis.set_xlabel("members in the gang")
        axis.set_ylabel(unit)
        axis.legend(fontsize=7)
    axes[0].set_title("gang phases (x: goals at 10,000: 20 s, 5 s, 10 s)", fontsize=10)
    axes[1].set_title("central CPU (x: goal at 10,000, notary 1 ms)", fontsize=10)
    axes[2].set_title("API calls and memory (x: goals at 10,000: 0.01, 300 MB)", fontsize=10)
    fig.suptitle("A gang against trainhook's real central parts on one 2-core machine (bench/gang_scale_sim.py): "
                 "v1.20 API server and controllers, webhook and notary, coordinator; simulated members", fontsize=10)
    fig.tight_layout()
    fig.savefig(DOCS / "performance-scale-sim.png", dpi=110)


def main() -> None:
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="where the JSON results are (default %(default)s)")
    results = parser.parse_args().results
    admission = results / "admission.json"
    if admission.exists():
        plot_admission(json.loads(admission.read_text()))
    gang = results / "gang_start.json"
    if gang.exists():
        plot_gang_start(json.loads(gang.read_text()))
    scale = [r for f in sorted(results.glob("node_start_scale_*.json")) for r in json.loads(f.read_text())["rounds"]]
    if scale:
        plot_gang_scale(scale)
    sims = [json.loads(f.read_text()) for f in sorted(results.glob("gang-scale-*.json")) if f.stat().st_size]
    if sims:
        plot_scale_sim(sims)


if __name__ == "__main__":
    main()
