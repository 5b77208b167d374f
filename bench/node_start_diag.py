"""Where a bare ConfigMap-path gang's start goes (issue 26), from its pods' own log timestamps (kubectl logs
--timestamps): per pod the launcher's first line (said once it has the gang's key from the notary), its join of
rank 0's coordinator, the errors its connection retried on, and the training's first line (GANGSTART); with the
kubelet's timestamps and the DNS queries. bench/node_start_scale.py says how long; this says where.

    python bench/node_start_diag.py 32      (root; the node up, under its lock)
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import re
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import node_start_scale as scale  # noqa: E402  (bench/ is not a package)

node_start = scale.node_start


def stamped(lines: str, start: float) -> list[tuple[float, str]]:
    """(seconds after `start`, text) for each line kubectl prefixed with its RFC 3339 timestamp."""
    out = []
    for line in lines.splitlines():
        if line[:2] != "20":
            continue
        stamp, _, rest = line.partition(" ")
        moment = dt.datetime.strptime(stamp[:26].rstrip("Z"), "%Y-%m-%dT%H:%M:%S.%f")
        out.append((moment.replace(tzinfo=dt.timezone.utc).timestamp() - start, rest))
    return out


def first(lines: list[tuple[float, str]], text: str) -> float | None:
    return next((t for t, line in lines if text in line), None)


def spread(values: list[float]) -> str:
    values = sorted(v for v in values if v is not None)
    return f"{values[0]:.2f} / {statistics.median(values):.2f} / {values[-1]:.2f}" if values else "none"


def main(size: int) -> dict:
    node_mod = sys.modules["trainhook_hack_node"]
    running, started = node_mod.ensure_up(node_mod.default_state_dir())
    node = node_start.Node(running)
    node_start.install_chart(node)
    namespace, name = "default", f"diag-{size}-{uuid.uuid4().hex[:4]}"
    start = time.time()
    node.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": scale.gang("configmap", name, size, node.images["torch"])}))
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and f"all {size} members are here" not in node.kubectl(
                "logs", "-n", namespace, f"{name}-0", "-c", "trainer", check=False):
            time.sleep(1)
        time.sleep(3)
        queries = scale.cluster_dns.query_counts(scale.node_config.host_ip(), 53, containing=name)
        pods = scale.pods_of(node, namespace, name)
        rows = []
        for i in range(size):
            lines = stamped(node.kubectl("logs", "--timestamps", "-n", namespace, f"{name}-{i}", "-c", "trainer",
                                         check=False), start)
            errors = collections.Counter(re.sub(r".*yet: (.*); retrying", r"\1", line) for _, line in lines
                                         if "cannot reach" in line)
            rows.append({"rank": i, "first_line": lines[0][0] if lines else None,
                         "joined": first(lines, "joined the gang's coordinator"),
                         "listening": first(lines, "listening on port"), "all_here": first(lines, "members are here"),
                         "gangstart": first(lines, "GANGSTART"), "errors": dict(errors)})
        started_at = {p["metadata"]["name"]: scale.seconds(s["state"]["running"]["startedAt"]) - start for p in pods
                      for s in p["status"].get("containerStatuses") or [] if "running" in s["state"]}
        starts = list(started_at.values())
        for row in rows:
            row["container_started"] = started_at.get(f"{name}-{row['rank']}")
    finally:
        scale.node_start_delete(node, namespace, name)
        if started:
            node_mod.ensure_down(node_mod.default_state_dir())
    errors: collections.Counter = collections.Counter()
    for row in rows:
        errors.update(row["errors"])
    out = {"size": size, "dns": {k: queries[k] for k in ("queries", "nxdomain", "tcp")},
           "kubelet": scale.kubelet_times(pods, start), "rows": rows}
    print("dns", out["dns"], "kubelet", out["kubelet"])
    print("rank 0: first line / coordinator listening / all here", rows[0]["first_line"], rows[0]["listening"],
          rows[0]["all_here"])
    print("min / median / max: containers started (1 s resolution)", spread(starts))
    print("  launcher's first line", spread([r["first_line"] for r in rows]))
    print("  its container's start -> the launcher's first line (startedAt: 1 s resolution)",
          spread([r["first_line"] - r["container_started"] for r in rows
                  if r["first_line"] is not None and r["container_started"] is not None]))
    print("  joined", spread([r["joined"] for r in rows]))
    print("  GANGSTART", spread([r["gangstart"] for r in rows]))
    print("the members' connection retried on", dict(errors))
    scale.OUT.mkdir(parents=True, exist_ok=True)
    (scale.OUT / f"node_start_diag_{size}.json").write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 32)
