"""`trainhook-launch tf-config`: from the TRAINHOOK_* variables alone, the TF_CONFIG the webhook injects."""

from __future__ import annotations

import argparse

import pytest

from trainhook.launcher import cli
from trainhook.launcher import tf_config as tf_config_command
from trainhook.launcher.pod_view import ConfigError
from trainhook.webhook.admission.mutate import mutate
from trainhook.webhook.settings import Settings
from objects import indexed_job, pod_of_job, pod_of_statefulset, statefulset

SETTINGS = Settings()
TF = {"trainhook.dev/framework": "tensorflow"}


def gang_pods(shape: str, port: str = "2222") -> list[dict]:
    """Every pod of a gang of Indexed Jobs `g-<role>` as the webhook admits it (a role of count 0 has none)."""
    counts = [(role, int(n)) for role, n in (part.split("=") for part in shape.split(","))]
    pods = []
    for role, count in [(role, count) for role, count in counts if count]:
        annotations = {"trainhook.dev/port": port}
        if len(counts) > 1:
            annotations["trainhook.dev/replicas"] = shape
        job = indexed_job(f"g-{role}", count, labels={**TF, "trainhook.dev/job-name": "g", "trainhook.dev/role": role},
                          annotations=annotations)
        job = mutate("Job", "CREATE", job, "team-a", SETTINGS).obj
        pods += [mutate("Pod", "CREATE", pod_of_job(job, i), "team-a", SETTINGS).obj for i in range(count)]
    return pods


def container_env(pod: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


def gang_only(env: dict[str, str]) -> dict[str, str]:
    """What an image that builds TF_CONFIG at run time sees: the TRAINHOOK_* variables, no TF_CONFIG."""
    return {k: v for k, v in env.items() if k.startswith("TRAINHOOK_")}


@pytest.mark.parametrize("shape", ["worker=2", "chief=1,ps=2,worker=2", "ps=1,worker=1,evaluator=1",
                                   "master=1,worker=3", "chief=1,ps=0,worker=2"])
def test_every_pod_prints_exactly_what_the_webhook_injects(shape):
    for pod in gang_pods(shape):
        env = container_env(pod)
        assert tf_config_command.env_tf_config(gang_only(env)) == env["TF_CONFIG"]


def test_a_role_of_count_zero_is_an_empty_job_of_the_cluster_in_both():
    env = container_env(gang_pods("chief=1,ps=0,worker=2")[0])
    assert '"ps":[]' in env["TF_CONFIG"]
    assert tf_config_command.env_tf_config(gang_only(env)) == env["TF_CONFIG"]


def test_the_port_comes_from_the_gang():
    pod = gang_pods("ps=1,worker=1", port="3456")[0]
    assert tf_config_command.env_tf_config(gang_only(container_env(pod))) == container_env(pod)["TF_CONFIG"]
    assert ":3456\"" in container_env(pod)["TF_CONFIG"]


def test_a_gang_of_one_prints_an_empty_cluster_that_tensorflow_reads_as_local():
    sts = mutate("StatefulSet", "CREATE", statefulset("solo", 1, labels=TF), "team-a", SETTINGS).obj
    env = container_env(mutate("Pod", "CREATE", pod_of_statefulset(sts, 0), "team-a", SETTINGS).obj)
    assert "TF_CONFIG" not in env
    assert tf_config_command.env_tf_config(env) == "{}"


def test_main_prints_the_json_on_stdout(monkeypatch, capsys):
    env = container_env(gang_pods("chief=1,worker=2")[2])
    for name in list(env):
        monkeypatch.delenv(name, raising=False)
    for name, value in gang_only(env).items():
        monkeypatch.setenv(name, value)
    assert tf_config_command.main(argparse.Namespace()) == 0
    assert capsys.readouterr().out == env["TF_CONFIG"] + "\n"


def test_a_gang_of_another_framework_is_refused_by_name():
    env = gang_only(container_env(gang_pods("worker=2")[0]))
    env["TRAINHOOK_FRAMEWORK"] = "pytorch"
    with pytest.raises(ConfigError, match="TRAINHOOK_FRAMEWORK='pytorch': tf-config is for tensorflow gangs"):
        tf_config_command.env_tf_config(env)


def test_missing_variables_are_named_together():
    env = gang_only(container_env(gang_pods("worker=2")[0]))
    del env["TRAINHOOK_REPLICAS"], env["TRAINHOOK_HOSTS"]
    with pytest.raises(ConfigError) as caught:
        tf_config_command.env_tf_config(env)
    assert "TRAINHOOK_REPLICAS" in str(caught.value) and "TRAINHOOK_HOSTS" in str(caught.value)


def test_the_launcher_registers_the_subcommand_with_its_help(capsys):
    assert cli.build_parser().parse_args(["tf-config"]).command == "tf-config"
    with pytest.raises(SystemExit) as done:
        cli.main(["tf-config", "--help"])
    assert done.value.code == 0
    shown = capsys.readouterr().out
    assert "TRAINHOOK_REPLICAS" in shown and "export TF_CONFIG=" in shown and "prints {}" in shown


def test_trainhook_launch_tf_config(monkeypatch, capsys):
    assert "tf-config" in cli.HANDLERS
    env = container_env(gang_pods("ps=1,worker=1")[1])
    for name, value in gang_only(env).items():
        monkeypatch.setenv(name, value)
    assert cli.main(["tf-config"]) == 0
    assert capsys.readouterr().out == env["TF_CONFIG"] + "\n"
    monkeypatch.setenv("TRAINHOOK_FRAMEWORK", "jax")
    assert cli.main(["tf-config"]) == 2
    assert "tf-config is for tensorflow gangs" in capsys.readouterr().err
