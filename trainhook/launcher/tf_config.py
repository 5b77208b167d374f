"""`trainhook-launch tf-config`: print this pod's TF_CONFIG, built from the TRAINHOOK_* variables.

For images whose entrypoint builds TF_CONFIG itself (or writes it to a file), e.g.

    export TF_CONFIG="$(trainhook-launch tf-config)" && python train.py

The JSON is the webhook's own: the cluster and the serialization come from the same pure functions
(`trainhook.gang.wiring`, which the webhook imports), so the printed value is byte for byte what it injects.
A gang of one pod, which the webhook gives no TF_CONFIG (Kubeflow's rule), prints `{}`: TensorFlow reads that
as "no cluster" and trains locally, where an empty string would make its json.loads fail.
"""

from __future__ import annotations

import argparse
import os
from typing import Mapping, Sequence

from trainhook.gang import keys
from trainhook.launcher.pod_view import ConfigError, GangView, parse_gang, parse_pairs
from trainhook.gang.wiring import cluster_spec, tf_config

NO_CLUSTER = "{}"



def gang_tf_config(gang: GangView, roles: Sequence[str] = ()) -> str:
    """The pod's TF_CONFIG, or `{}` for a gang of one; pure (a parsed gang in, a string out).

    `roles` are the roles named in the shape: one listed with count 0 is still an (empty) job of the cluster,
    as it is in the webhook's TF_CONFIG and in Kubeflow's.
    """
    if gang.framework != keys.TENSORFLOW:
        raise ConfigError(f"{keys.TH_FRAMEWORK}={gang.framework!r}: tf-config is for {keys.TENSORFLOW} gangs "
                          f"(label the workload {keys.FRAMEWORK}={keys.TENSORFLOW})")
    if gang.size == 1:
        return NO_CLUSTER
    addresses: dict[str, list[str]] = {role: [] for role in roles}
    for peer in gang.peers:
        addresses.setdefault(peer.role, []).append(peer.address)
    return tf_config(cluster_spec(addresses, gang.port), gang.role, gang.index)


def env_tf_config(env: Mapping[str, str]) -> str:
    """TF_CONFIG from an environment mapping; raises ConfigError naming every missing or bad variable."""
    gang = parse_gang(env)
    roles = [role for role, _ in parse_pairs(keys.TH_REPLICAS, env[keys.TH_REPLICAS], []) or []]
    return gang_tf_config(gang, roles)


def main(args: argparse.Namespace | None = None) -> int:
    print(env_tf_config(os.environ), flush=True)
    return 0

