"""The short version of `make bench-scale` (issue 32), run in CI: bench/gang_scale_sim.py with a small gang, end to
end against its own real control plane, the real webhook and notary, and a real coordinator process.

It checks what holds at any size, not the timings (those are bench/'s, on a quiet machine): the run goes through every
phase (credentials, the barrier, an in-place restart, the outcome recorded through the notary), prints the one JSON
object `make bench-scale` and docs/develop/performance.md read, with every figure the issue names; the notary's API
calls for the whole gang's credentials are a gang's cost (a few), not one or two per member as before issue 32; and the
coordinator runs a fixed handful of threads however many members are connected."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cluster_api import cluster

ROOT = Path(__file__).resolve().parents[2]
MEMBERS = 60
FIGURES = ("members", "member_connections_lost", "api_calls_per_member", "credential_s", "barrier_s", "restart_s", "notary_cpu_ms_per_member",
           "coordinator_cpu_ms_per_member", "coordinator_rss_mb", "admission_cpu_ms_per_pod", "outcome_s",
           "coordinator_threads", "coordinator_fds")


def test_a_small_gang_runs_every_phase_against_the_real_central_parts_and_reports_every_figure():
    cluster.ensure_binaries(quiet=True)  # the bench starts a control plane of its own, as `make bench-scale` does
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "gang_scale_sim.py"), "--members", str(MEMBERS),
                             "--procs", "2", "--json"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout)
    missing = [name for name in FIGURES if not isinstance(figures.get(name), (int, float))]
    assert not missing, (missing, figures)
    assert figures["members"] == MEMBERS
    assert figures["outcome_phase"] == "Succeeded", figures
    assert "recorded Succeeded" in figures["outcome_recorded"], figures
    # Before issue 32 the notary made a TokenReview and a pod GET for every member: 120 calls for 60 members.
    assert sum(figures["api_calls"].values()) <= 10, figures["api_calls"]
    # The coordinator's loop, rank 0's own link and answerer, the main thread: no thread per connection (60 members
    # made 60 more before issue 32); and every member's socket is open in that one process.
    assert figures["coordinator_threads"] <= 6, figures
    assert figures["coordinator_fds"] >= MEMBERS, figures
    # Every member went through every phase once, member 1 failed and the others were stopped, and there was one
    # restart round, not more: a member's connection lost mid-run is one more round under restart-gang (what the
    # simulated members' thread storm caused at 10,000 before they shared a selectors loop per process).
    phases = figures["phases"]
    assert {what: phases.get(what) for what in ("asked", "key", "joined", "start1", "start2", "finish", "done")} == {
        what: MEMBERS for what in ("asked", "key", "joined", "start1", "start2", "finish", "done")}, phases
    assert (phases.get("fail"), phases.get("stop1"), phases.get("start3")) == (1, MEMBERS - 1, None), phases
    assert figures["member_connections_lost"] == 0, figures["member_connections_lost_why"]
    # every member asked the notary from a loopback address of its own, as each pod has its own
    assert figures["notary_source_addresses"] == MEMBERS, figures
    for phase in ("credential_s", "barrier_s", "restart_s", "outcome_s"):
        assert 0 <= figures[phase] < 60, (phase, figures)
