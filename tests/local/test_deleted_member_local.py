"""A deleted member's exit code, with real processes (issue 25 item 5; root, network namespaces: run it under
`flock -s /tmp/trainhook-node.lock`).

docs/use/gang-lifecycle.md's rule: exit codes 128 and above are signals (retryable), and a member that goes away
without a word counts as 129. A deleted pod does not go away without a word: as the kubelet does, `trainhook local
delete` sends its containers SIGTERM, the launcher passes it to the training and reports what the training exits
with, 143 (128 + SIGTERM) for a process the signal ends. So the gang is recorded as failed with 143, by rank 1,
the pod that was deleted, and the docs say so (they said 129).
"""

from __future__ import annotations

import json

from helpers import wait_for
from test_elastic_local import Run
from test_gang_local import gang

from trainhook.gang import keys


def test_a_deleted_member_of_a_fixed_gang_is_recorded_with_143(tmp_path):
    run = Run(tmp_path, gang("del", replicas=2, env={"TRAIN_SECONDS": 120}), timeout=150)
    stored = run.dir / "notary" / "workloads" / "default" / "StatefulSet" / "del.json"

    def recorded() -> dict:
        annotations = json.loads(stored.read_text())["metadata"].get("annotations") or {} if stored.exists() else {}
        return annotations if keys.PHASE in annotations else {}
    try:
        run.wait_line(r"^\[del-1\] TRAIN START rank=1 attempt=1 ", timeout=120)
        deleted = run.delete("del-1")
        assert deleted.returncode == 0, deleted.stderr
        # What the coordinator had the notary write on the StatefulSet, as on a cluster.
        try:
            annotations = wait_for("the gang's outcome on the StatefulSet", recorded, timeout=60)
        except AssertionError as e:
            raise AssertionError(f"{e}; the run said:\n{run.output()[-6000:]}") from None
    finally:
        if run.proc.poll() is None:
            run.proc.terminate()
            run.proc.wait(timeout=60)
    output = run.output()
    assert "[del-1] STOPPED by SIGTERM rank=1 attempt=1" in output, output[-5000:]
    assert (annotations[keys.PHASE], annotations[keys.EXIT_CODE]) == ("Failed", "143"), annotations
    assert annotations[keys.PHASE_REASON].startswith("rank 1 (worker-1 at del-1.del) exited with 143"), annotations
