"""A gang that ends while the notary is away is still recorded once it is back (issue 31 item 4).

Seen on a real node: trainhook's Deployment scaled to 0 for about a minute while two gangs ended; rank 0 logged
`the outcome is not recorded: ... connection refused` and parked, and three minutes after the Deployment was back
neither gang had a phase, an Event or a scale to zero. Now the coordinator keeps its outcome until the notary has
recorded it (launcher/ending.py Recorder). Shown with the real launcher and the real notary process
(tests/support/gang_notary.py), stopped while the gang trains and started again on the same port with the same
certificates, as a webhook pod that comes back behind its Service. tests/e2e/test_e2e_outcome_kept.py shows it on
the node with the Deployment scaled to zero.
"""

from __future__ import annotations

import subprocess
import sys
import time

from gang_notary import GangNotary, indexed_job
from helpers import wait_for
from webhook_process import free_port

TRAINING = "import time; print('training', flush=True); time.sleep(4); print('done', flush=True)"


def test_an_outcome_is_recorded_after_the_notary_comes_back(tmp_path):
    job = indexed_job("kept", "ns", command=[sys.executable, "-c", TRAINING])
    with GangNotary(tmp_path / "run") as notary:
        [pod] = notary.admit(job)
        env = {**notary.env(pod), "TRAINHOOK_COORDINATOR_PORT": str(free_port()), "PATH": "/usr/bin:/bin"}
        log = tmp_path / "launcher.log"
        with open(log, "wb") as out:
            launcher = subprocess.Popen([sys.executable, "-m", "trainhook.launcher.cli", "run", "--", sys.executable,
                                         "-c", TRAINING], stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            wait_for("the training to start", lambda: "training" in log.read_text(), timeout=60)
            notary.server.stop()  # away while the gang ends: every try is refused
            wait_for("the first tries to fail", lambda: "not recorded yet" in log.read_text()
                     or "the outcome is not recorded:" in log.read_text(), timeout=60)
            assert launcher.poll() is None, "the coordinator keeps its outcome: it has not exited with it unrecorded"
            time.sleep(5)
            notary.server.start()  # back, on the same port and with the same CA
            try:  # the next try comes within the growing delay (at most 30 s) after the notary is back
                code = launcher.wait(timeout=240)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"not recorded 240 s after the notary came back:\n{log.read_text()}\n"
                                     f"the notary:\n{notary.server.log_tail(40)}") from None
        finally:
            if launcher.poll() is None:
                launcher.kill()
        said = log.read_text()
        assert code == 0, said
        assert "the notary recorded the outcome: Succeeded" in said and "tries)" in said, said
        annotations = notary.workload("ns", "Job", "kept")["metadata"]["annotations"]
        assert annotations["trainhook.dev/phase"] == "Succeeded", annotations
