"""An MPI gang on the node over the kubexec transport: the launcher's rsh agent starts Open MPI's daemons in the
worker pods through the real exec API (the API server to the kubelet, over a websocket the launcher's standard
library speaks: launcher/kube_api.py), with the user's MPI image (Debian's Open MPI and mpi4py, nothing of
trainhook). examples/mpi/allreduce.yaml's gang as one StatefulSet (v1.20 has no Indexed Jobs): pod 0 launches,
every member parks once mpirun is done, the outcome is recorded and the StatefulSet scaled to zero."""

from __future__ import annotations

import re

import yaml

from e2e_gangs import NAMESPACE, delete_gang, statefulset, statefulset_gang
from e2e_helpers import REPO, LogFollower, wait_for

NAME = "mpi-allreduce"


def test_an_mpi_gang_runs_its_ranks_in_the_worker_pods_through_the_exec_api(node, release):
    script = [d for d in yaml.safe_load_all((REPO / "examples" / "mpi" / "allreduce.yaml").read_text())
              if d and d["kind"] == "ConfigMap"][0]["data"]["allreduce.py"]
    objects = statefulset_gang(NAME, node.images["mpi"], ["python3", "-c", script], 3, framework="mpi")
    delete_gang(node, NAME)
    follower = None
    try:
        node.apply(NAMESPACE, objects)
        follower = LogFollower(node, NAMESPACE, f"{NAME}-0", "trainer")

        def done():
            sts = statefulset(node, NAME)
            phase = (sts["metadata"].get("annotations") or {}).get("trainhook.dev/phase")
            assert phase != "Failed", follower.text[-3000:]
            return phase == "Succeeded" and sts
        try:
            sts = wait_for(done, 180, "the MPI gang to succeed", interval=2)
        except BaseException:
            print(follower.text[-4000:])
            print(node.describe(NAMESPACE))
            raise
        text = follower.text
        assert "OpenMPI, kubexec transport" in text
        assert re.search(rf"allreduce over 3 ranks on 3 hosts \({NAME}-0, {NAME}-1, {NAME}-2\): sum=6 expected=6",
                         text), text[-3000:]
        assert "mpi library: Open MPI" in text
        assert sts["metadata"]["annotations"]["trainhook.dev/exit-code"] == "0"
        wait_for(lambda: statefulset(node, NAME)["spec"]["replicas"] == 0, 60, "the StatefulSet scaled to zero")
    finally:
        if follower is not None:
            follower.stop()
        delete_gang(node, NAME, wait=False)
