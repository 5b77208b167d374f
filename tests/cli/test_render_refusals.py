"""`trainhook render` (and `submit` from flags, and the SDK's job_manifests) refuse what would only fail later, each
with the reason and the fix (issue 34): no training command, a name Kubernetes will not take (said as a case
problem when it is one, never blamed on the length), and `--max-restarts` that nothing would read."""

from __future__ import annotations

import pytest
import yaml

from trainhook.cli import main
from trainhook.render import RenderError
from trainhook.sdk.core import job_manifests

GANG = ["--workers", "2", "--image", "example.com/train:1"]


def render(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["render", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_gang_without_a_command_is_refused_with_where_to_give_it(capsys):
    code, out, err = render(capsys, "mnist", *GANG)
    assert (code, out) == (2, "")
    assert err.startswith("error: no training command: give it after `--` (trainhook render NAME ... -- python "
                          "/train.py) or as --command 'python /train.py'")
    assert "ENTRYPOINT" in err


@pytest.mark.parametrize("name, example", [("MyJob", "myjob"), ("Train_Run.2", "train-run-2"), ("7b-ddp", "b-ddp"),
                                           ("ddp-", "ddp")])
def test_a_name_kubernetes_would_not_take_is_refused_as_lower_case_rfc_1123_not_as_too_long(capsys, name, example):
    code, out, err = render(capsys, name, *GANG, "--", "python", "/train.py")
    assert (code, out) == (2, "")
    assert err.startswith(f"error: NAME {name!r}: a gang's name must be lower case: letters a-z, digits and '-', "
                          f"starting with a letter and ending with a letter or digit (e.g. {example});")
    assert "RFC 1123" in err
    assert "long" not in err and "63" not in err


def test_a_name_too_long_for_its_pods_host_names_is_refused_with_the_room_left(capsys):
    fits = "a" * 61  # pods a...a-0, a...a-1: 63 characters
    assert render(capsys, fits, *GANG, "--", "python", "/train.py")[0] == 0
    code, _, err = render(capsys, fits + "b", *GANG, "--", "python", "/train.py")
    assert code == 2
    assert err.strip() == (f"error: NAME '{fits}b' is too long: its pod host name {fits}b-1 has 64 characters, and a "
                           "DNS label at most 63; give a name of at most 61 characters")
    # a multi-role gang's pods are <name>-<role>-<index>
    code, _, err = render(capsys, "a" * 55, "--role", "master=1", *GANG, "--", "python", "/train.py")
    assert code == 2 and f"pod host name {'a' * 55}-master-0 has 64 characters" in err


@pytest.mark.parametrize("on_failure, given", [([], ""), (["--on-failure", "fail-gang"],
                                                         " (given: --on-failure fail-gang)")])
def test_max_restarts_without_restart_gang_is_refused_naming_both_flags(capsys, on_failure, given):
    code, out, err = render(capsys, "mnist", *GANG, "--max-restarts", "3", *on_failure, "--", "python", "/train.py")
    assert (code, out) == (2, "")
    assert err.strip() == (f"error: --max-restarts 3 counts the gang's restarts, which only --on-failure restart-gang "
                           f"makes{given} (or torchrun's, with --elastic): add --on-failure restart-gang, or drop "
                           "--max-restarts")


@pytest.mark.parametrize("extra, key", [(["--on-failure", "restart-gang"], "trainhook.dev/on-failure"),
                                        (["--elastic", "1:2"], "trainhook.dev/elastic")])
def test_max_restarts_with_what_reads_it_is_rendered(capsys, extra, key):
    code, out, err = render(capsys, "mnist", *GANG, "--max-restarts", "3", *extra, "--", "python", "/train.py")
    assert code == 0, err
    annotations = list(yaml.safe_load_all(out))[1]["metadata"]["annotations"]
    assert annotations["trainhook.dev/max-restarts"] == "3" and key in annotations


def test_submit_from_flags_refuses_the_same_before_connecting(capsys):
    """The refusal comes before any connection: the kubeconfig named does not even exist."""
    code = main(["submit", "MyJob", *GANG, "--kubeconfig", "/nonexistent/kubeconfig", "--", "python", "/t.py"])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err.startswith("error: NAME 'MyJob': a gang's name must be lower case")


def test_the_sdk_refuses_an_upper_case_name_the_same_way():
    with pytest.raises(RenderError, match=r"NAME 'MyJob': a gang's name must be lower case"):
        job_manifests("MyJob", command=["python", "/train.py"], num_workers=2)
