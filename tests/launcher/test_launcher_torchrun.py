"""`trainhook-launch torchrun`: torchrun's arguments from the environment, and a real two-node CPU run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from trainhook.launcher.pod_view import ConfigError
from trainhook.launcher.torchrun import FLAG_OPTIONS, TORCHRUN, option_name, torchrun_argv
from webhook_process import free_port

LAUNCH = [sys.executable, "-m", "trainhook.launcher.cli"]

STATIC = {
    "MASTER_ADDR": "job-master-0.job", "MASTER_PORT": "23456", "WORLD_SIZE": "4", "RANK": "2",
    "PET_MASTER_ADDR": "job-master-0.job", "PET_MASTER_PORT": "23456", "PET_NNODES": "4",
    "PET_NODE_RANK": "2", "PET_NPROC_PER_NODE": "1",
}
ELASTIC = {
    **STATIC, "PET_NNODES": "2:4", "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "job-master-0.job:23456",
    "PET_RDZV_ID": "job", "PET_MAX_RESTARTS": "3",
}


def test_a_static_gang_gets_node_rank_and_master_address():
    assert torchrun_argv(STATIC, ["train.py", "--lr", "0.1"]) == [
        *TORCHRUN, "--nnodes", "4", "--nproc-per-node", "1", "--node-rank", "2",
        "--master-addr", "job-master-0.job", "--master-port", "23456", "train.py", "--lr", "0.1"]


def test_kubeflow_names_stand_in_for_missing_pet_variables():
    env = {"MASTER_ADDR": "m.job", "MASTER_PORT": "1234", "RANK": "1", "PET_NNODES": "2"}
    assert torchrun_argv(env, ["train.py"]) == [
        *TORCHRUN, "--nnodes", "2", "--node-rank", "1", "--master-addr", "m.job", "--master-port", "1234",
        "train.py"]


def test_an_elastic_gang_gets_the_c10d_rendezvous_and_no_fixed_rank():
    argv = torchrun_argv(ELASTIC, ["train.py"])
    assert argv == [
        *TORCHRUN, "--nnodes", "2:4", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "job-master-0.job:23456", "--rdzv-id", "job", "--max-restarts", "3", "train.py"]


@pytest.mark.parametrize("user_flags, dropped", [
    (["--nproc-per-node", "2"], "--nproc-per-node"),
    (["--nproc_per_node=2"], "--nproc-per-node"),
    (["--master-port", "2999"], "--master-port"),
    (["--node_rank", "0"], "--node-rank"),
])
def test_a_flag_the_user_passes_wins_over_the_environment(user_flags, dropped):
    argv = torchrun_argv(STATIC, [*user_flags, "train.py", "--nnodes", "9"])
    ours = argv[len(TORCHRUN):argv.index(user_flags[0])]
    assert dropped not in ours
    assert argv[-len(user_flags) - 3:] == [*user_flags, "train.py", "--nnodes", "9"]
    assert ours.count("--nnodes") == 1 and "9" not in ours  # the script's own flags are not torchrun's


def test_flags_without_values_and_a_double_dash_are_understood():
    argv = torchrun_argv(STATIC, ["--no-python", "-r", "3", "--", "echo", "hi"])
    assert argv[-5:] == ["--no-python", "-r", "3", "echo", "hi"]
    module = torchrun_argv(STATIC, ["-m", "pkg.train", "--epochs", "1"])
    assert module[-4:] == ["-m", "pkg.train", "--epochs", "1"]


def test_standalone_needs_no_gang_variables():
    argv = torchrun_argv({"PET_NPROC_PER_NODE": "2"}, ["--standalone", "train.py"])
    assert argv == [*TORCHRUN, "--nproc-per-node", "2", "--standalone", "train.py"]


def test_missing_variables_are_named_and_user_flags_satisfy_them():
    with pytest.raises(ConfigError) as error:
        torchrun_argv({"PET_NNODES": "2"}, ["train.py"])
    message = str(error.value)
    assert "PET_NODE_RANK or RANK (for --node-rank)" in message
    assert "PET_MASTER_ADDR or MASTER_ADDR (for --master-addr)" in message
    assert "PET_NNODES" not in message
    argv = torchrun_argv({"PET_NNODES": "2"}, ["--node-rank", "0", "--master-addr", "a", "--master-port", "1",
                                               "train.py"])
    assert argv[-7:] == ["--node-rank", "0", "--master-addr", "a", "--master-port", "1", "train.py"]


@pytest.mark.parametrize("name, value", [("PET_NNODES", "two"), ("PET_NODE_RANK", "-1"),
                                         ("PET_MASTER_PORT", "99999"), ("PET_NPROC_PER_NODE", "many")])
def test_a_malformed_variable_is_named(name, value):
    with pytest.raises(ConfigError) as error:
        torchrun_argv({**STATIC, name: value}, ["train.py"])
    assert f"{name}={value!r}" in str(error.value)


def test_a_missing_script_is_an_error():
    with pytest.raises(ConfigError, match="no training script"):
        torchrun_argv(STATIC, ["--nproc-per-node", "2"])


def test_the_flag_table_matches_torchruns_own_parser():
    """If torch adds or renames a value-less option, splitting the user's flags would go wrong: catch it here."""
    from torch.distributed.run import get_args_parser

    actions = [a for a in get_args_parser()._actions if a.option_strings]
    theirs = {option_name(o) for a in actions if a.nargs == 0 for o in a.option_strings}
    assert theirs == FLAG_OPTIONS
    known = {option_name(o) for a in actions for o in a.option_strings}
    ours = {t for t in torchrun_argv(ELASTIC, ["x.py"]) + torchrun_argv(STATIC, ["x.py"]) if t.startswith("--")}
    assert ours <= known


SCRIPT = textwrap.dedent("""
    import os
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum {value.item():g}", flush=True)
    dist.destroy_process_group()
""")


def test_two_nodes_train_together_through_the_launcher(tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(SCRIPT)
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2",
               "RANK": str(rank), "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": port, "PET_NNODES": "2",
               "PET_NODE_RANK": str(rank), "PET_NPROC_PER_NODE": "1", "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([*LAUNCH, "torchrun", str(script)], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    results = [p.communicate(timeout=60) for p in procs]
    for rank, (proc, (out, err)) in enumerate(zip(procs, results)):
        assert proc.returncode == 0, err
        assert f"rank {rank} of 2: sum 3" in out
        assert f"--node-rank {rank} --master-addr 127.0.0.1 --master-port {port}" in err
