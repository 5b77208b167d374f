"""The container images and `make e2e-kind`, checked without a container engine (none runs on these machines).

What an image build would do is replayed here: its RUN steps run in a fresh virtual environment standing in for
/opt/trainhook, from a build context holding only what the Dockerfile copies (and the .dockerignore lets
through), and the entrypoints then run from it. The rest is static: pinned base, non-root numeric
user, entrypoints that are pyproject's console scripts and agree with the chart and the webhook, pinned
dependencies. The e2e script's helm values render with the real Helm, and its log check runs on the example's
own output format.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from chart_render import find, render_chart

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SCRIPTS = PYPROJECT["project"]["scripts"]
VALUES = yaml.safe_load((REPO / "charts" / "trainhook" / "values.yaml").read_text())
APP_VERSION = yaml.safe_load((REPO / "charts" / "trainhook" / "Chart.yaml").read_text())["appVersion"]
E2E = REPO / "hack" / "e2e-kind.sh"
# image -> (console script, the chart value naming its repository)
IMAGE_OF = {"webhook": ("trainhook-webhook", "image"), "launcher": ("trainhook-launch", "launcherImage")}
VENV = "/opt/trainhook"


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; comments dropped, backslash continuations joined."""
    out, pending = [], ""
    for line in dockerfile.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).strip().partition(" ")
        out.append((keyword.upper(), rest.strip()))
        pending = ""
    return out


def stages(dockerfile: Path) -> list[list[tuple[str, str]]]:
    """The instructions per build stage (global ARGs before the first FROM are stage 0's)."""
    result: list[list[tuple[str, str]]] = [[]]
    for keyword, rest in instructions(dockerfile):
        if keyword == "FROM" and any(k == "FROM" for k, _ in result[-1]):
            result.append([])
        result[-1].append((keyword, rest))
    return result


def final_stage(dockerfile: Path) -> list[tuple[str, str]]:
    return stages(dockerfile)[-1]


def last(stage: list[tuple[str, str]], keyword: str) -> str:
    values = [rest for k, rest in stage if k == keyword]
    assert values, f"no {keyword}"
    return values[-1]


def dockerfile(image: str) -> Path:
    return IMAGES / f"{image}.Dockerfile"


@pytest.mark.parametrize("image", list(IMAGE_OF))
def test_the_base_image_is_an_exact_python_patch_release(image):
    steps = instructions(dockerfile(image))
    (arg,) = [rest for k, rest in steps if k == "ARG" and rest.startswith("PYTHON_IMAGE=")]
    base = arg.split("=", 1)[1]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", base), base
    assert [rest.split()[0] for k, rest in steps if k == "FROM"] == ["${PYTHON_IMAGE}"] * 3
    # The Python the tests run is the image's minor version.
    assert base.startswith(f"python:{sys.version_info.major}.{sys.version_info.minor}.")


def test_both_images_share_one_base_and_one_build_stage():
    webhook, launcher = stages(dockerfile("webhook")), stages(dockerfile("launcher"))
    assert webhook[0] == launcher[0]  # the global ARG and the build stage
    assert webhook[1] == launcher[1]  # the entry program's stage: the ConfigMap's is the init container's


def entry_stage(image: str) -> list[tuple[str, str]]:
    (stage,) = [s for s in stages(dockerfile(image)) if s[0] == ("FROM", "${PYTHON_IMAGE} AS entry")]
    return stage


@pytest.mark.parametrize("image", list(IMAGE_OF))
def test_the_image_carries_the_static_entry_program_where_delivery_looks_for_it(image):
    """The webhook (its ConfigMap) and the launcher image (its init container) deliver the program the image
    built, from launcher/entry/ with deliver's flags, at deliver.PREBUILT under the image's environment."""
    from trainhook.launcher import deliver
    stage = entry_stage(image)
    (copy,) = [rest.split() for k, rest in stage if k == "COPY"]
    assert REPO / copy[0] == deliver.ENTRY_SOURCE
    compile_words = shlex.split(last(stage, "RUN"))
    assert compile_words == ["musl-gcc", *deliver.ENTRY_FLAGS, "-o", compile_words[-2], copy[1]]
    prebuilt = deliver.PREBUILT.relative_to(sys.prefix)
    assert ("COPY", f"--from=entry {compile_words[-2]} {VENV}/{prebuilt}") in final_stage(dockerfile(image))


@pytest.mark.parametrize("image", list(IMAGE_OF))
def test_the_image_runs_as_a_numeric_non_root_user_the_chart_and_webhook_agree_with(image):
    user = last(final_stage(dockerfile(image)), "USER")
    assert re.fullmatch(r"\d+:\d+", user), f"USER {user}: numeric, or the kubelet cannot verify runAsNonRoot"
    uid, gid = (int(part) for part in user.split(":"))
    assert uid != 0 and gid != 0
    if image == "webhook":
        assert (uid, gid) == (VALUES["podSecurityContext"]["runAsUser"], VALUES["podSecurityContext"]["runAsGroup"])
    else:
        assert uid == injected_init_container()["securityContext"]["runAsUser"]


@pytest.mark.parametrize("image", list(IMAGE_OF))
def test_the_entrypoint_is_the_images_console_script(image):
    script, _ = IMAGE_OF[image]
    stage = final_stage(dockerfile(image))
    assert json.loads(last(stage, "ENTRYPOINT")) == [script]  # exec form: signals reach the process
    assert script in SCRIPTS
    env = dict(shlex.split(kv)[0].split("=", 1) for kv in shlex.split(last(stage, "ENV")))
    assert env["PATH"].split(":")[0] == f"{VENV}/bin"
    assert ("COPY", f"--from=build {VENV} {VENV}") in stage


def test_the_webhook_image_is_what_the_chart_runs():
    deployment = find(render_chart({}, "trainhook"), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    stage = final_stage(dockerfile("webhook"))
    assert container["command"] == json.loads(last(stage, "ENTRYPOINT"))
    assert container["image"] == f"{VALUES['image']['repository']}:{APP_VERSION}"
    assert [p["containerPort"] for p in container["ports"]] == [int(p) for p in last(stage, "EXPOSE").split()]


def injected_init_container() -> dict:
    """The gang-wait init container the webhook really injects into the example's first pod."""
    import base64

    import jsonpatch

    from objects import pod_of_statefulset, review
    from trainhook.webhook.admission.review import review as answer
    from trainhook.webhook.settings import Settings

    def admitted(obj: dict) -> dict:
        reply = answer(review(obj), Settings()).answer["response"]
        return jsonpatch.apply_patch(obj, json.loads(base64.b64decode(reply["patch"])))

    docs = list(yaml.safe_load_all((REPO / "examples" / "pytorch" / "ddp.yaml").read_text()))
    sts = admitted({**docs[2], "metadata": {**docs[2]["metadata"], "namespace": "default"}})
    mutated = admitted(pod_of_statefulset(sts, 0))
    (init,) = [c for c in mutated["spec"]["initContainers"] if c["name"] == "trainhook-gang-wait"]
    return init


def test_the_launcher_image_is_what_the_webhook_injects():
    init = injected_init_container()
    assert init["image"] == f"{VALUES['launcherImage']['repository']}:{APP_VERSION}"
    assert init["command"][0] == json.loads(last(final_stage(dockerfile("launcher")), "ENTRYPOINT"))[0]


# --- dependencies --------------------------------------------------------------------------------------------------

def pins() -> dict[str, str]:
    found: dict[str, str] = {}
    for line in (IMAGES / "constraints.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, _, version = line.partition("==")
        assert version and re.fullmatch(r"[A-Za-z0-9._-]+", name), f"not name==version: {line}"
        assert canonicalize_name(name) not in found, f"pinned twice: {name}"
        found[canonicalize_name(name)] = version
    return found


def test_every_dependency_is_pinned_within_pyprojects_range():
    pinned = pins()
    for text in PYPROJECT["project"]["dependencies"]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{name} is a dependency but not pinned in images/constraints.txt"
        assert requirement.specifier.contains(pinned[name]), f"{name}=={pinned[name]} is outside {requirement}"


# --- the build, replayed ----------------------------------------------------------------------------------------

def copied_sources(stage: list[tuple[str, str]]) -> list[str]:
    return [src for keyword, rest in stage if keyword == "COPY" and not rest.startswith("--from")
            for src in rest.split()[:-1]]


def dockerignore_allows(image: str) -> list[str]:
    lines = (IMAGES / f"{image}.Dockerfile.dockerignore").read_text().splitlines()
    assert "*" in lines, "an allowlist: everything else stays out of the build context"
    return [line[1:] for line in lines if line.startswith("!")]


@pytest.mark.parametrize("image", list(IMAGE_OF))
def test_the_build_copies_every_package_and_the_context_lets_it(image):
    build = stages(dockerfile(image))[0]
    copied = copied_sources(build)
    assert "trainhook" in copied, "the package's one folder (trainhook/, with webhook/, launcher/, certs/ in it)"
    assert {"pyproject.toml", PYPROJECT["project"]["readme"], "images/constraints.txt"} <= set(copied)
    assert sorted(copied) == sorted(dockerignore_allows(image))
    for source in copied:
        assert (REPO / source).exists(), source


def test_the_images_build_steps_install_a_working_non_root_entrypoint(tmp_path):
    """The build stage's RUN steps, in a build context holding only what it copies, with /opt/trainhook in a
    temporary directory (pip's cache is kept, unlike in the image, to spare the network); then each image's
    entrypoint runs from that environment."""
    build = stages(dockerfile("webhook"))[0]
    context, venv = tmp_path / "src", tmp_path / "opt-trainhook"
    context.mkdir()
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for keyword, rest in build:
        if keyword == "COPY":
            *sources, _ = rest.split()
            for source in sources:
                target = context / source
                target.parent.mkdir(parents=True, exist_ok=True)
                if (REPO / source).is_dir():
                    shutil.copytree(REPO / source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
                else:
                    shutil.copy(REPO / source, target)
        elif keyword == "RUN":
            command = rest.replace(VENV, str(venv)).replace("python -m venv", f"{sys.executable} -m venv")
            done = subprocess.run(["sh", "-c", command], cwd=context, env=env, capture_output=True, text=True,
                                  timeout=900)
            assert done.returncode == 0, f"RUN {rest}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    # COPY --from keeps the modes: the image's user (not root) must be able to read every file and enter every
    # directory of the environment.
    for path in [venv, *venv.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        assert mode & 0o004 and (not path.is_dir() or mode & 0o001), f"{path}: {oct(mode)} is not world-readable"
    run_env = {"PATH": f"{venv}/bin:/usr/bin:/bin", "HOME": "/nonexistent"}
    # The entry stage's compile, with this machine's compiler standing in for musl-gcc (same source and flags),
    # put where the final stage's COPY --from=entry puts it: `install` (the init container) delivers it.
    from trainhook.launcher import deliver
    compiler = next((c for c in deliver.COMPILERS if shutil.which(c)), None)
    assert compiler, "no C compiler: install gcc and libc6-dev"
    compile_words = shlex.split(last(entry_stage("launcher"), "RUN"))
    prebuilt = venv / deliver.PREBUILT.relative_to(sys.prefix)
    prebuilt.parent.mkdir(parents=True)
    done = subprocess.run([compiler, *compile_words[1:-3], "-o", str(prebuilt), str(deliver.ENTRY_SOURCE)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([f"{venv}/bin/trainhook-launch", "install", str(tmp_path / "delivered")], env=run_env,
                          capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0 and "(a static program)" in done.stderr, done.stderr
    assert (tmp_path / "delivered" / "bin" / "trainhook-launch").read_bytes() == prebuilt.read_bytes()
    for image, (script, _) in IMAGE_OF.items():
        entrypoint = json.loads(last(final_stage(dockerfile(image)), "ENTRYPOINT"))
        done = subprocess.run([*entrypoint, "--help"], env=run_env, capture_output=True, text=True, timeout=120,
                              cwd="/")
        assert done.returncode == 0, done.stderr
        assert f"usage: {script}" in done.stdout
    # The installed package is the one built from the copied sources, not this checkout.
    where = subprocess.run([f"{venv}/bin/python", "-c", "import trainhook.webhook.server as s; print(s.__file__)"],
                           capture_output=True, text=True, cwd="/", env=run_env)
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr


# --- make e2e-kind ---------------------------------------------------------------------------------------------

def e2e_defaults() -> dict[str, str]:
    return dict(re.findall(r"^(\w+)=\$\{\1:-([^}]*)\}$", E2E.read_text(), re.M))


def test_the_e2e_script_is_valid_bash_and_uses_the_charts_default_images():
    assert subprocess.run(["bash", "-n", str(E2E)]).returncode == 0
    assert os.access(E2E, os.X_OK)
    defaults = e2e_defaults()
    assert defaults["IMAGE_TAG"] == APP_VERSION
    for image, (_, value) in IMAGE_OF.items():
        assert f"{defaults['IMAGE_REGISTRY']}/{image}" == VALUES[value]["repository"]
    for path in ("charts/trainhook", "examples/pytorch/ddp.yaml", "hack/get_helm.py"):
        assert path in E2E.read_text() and (REPO / path).exists(), path


def test_the_e2e_helm_values_render_the_loaded_images():
    """The script's `--set` flags, with its defaults filled in, through the real Helm (schema included)."""
    defaults = e2e_defaults()
    values: dict = {}
    for key, value in re.findall(r'--set ([\w.]+)="?([^"\s]+)"?', E2E.read_text()):
        value = re.sub(r"\$(\w+)", lambda m: defaults[m.group(1)], value)
        node = values
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    assert values["image"]["pullPolicy"] == "Never"  # kind-loaded images only
    manifests = render_chart(values, "trainhook")
    (container,) = find(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"{defaults['IMAGE_REGISTRY']}/webhook:{defaults['IMAGE_TAG']}"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TRAINHOOK_WEBHOOK_LAUNCHER_IMAGE"] == f"{defaults['IMAGE_REGISTRY']}/launcher:{defaults['IMAGE_TAG']}"
    assert env["TRAINHOOK_WEBHOOK_CERT_MODE"] == "self-managed"
    assert "trainhook" in E2E.read_text().split("mutatingwebhookconfiguration", 1)[1].split()[0]
    assert find(manifests, "MutatingWebhookConfiguration")["metadata"]["name"] == "trainhook"


def test_the_e2e_log_check_finds_each_ranks_digest(tmp_path):
    """The script's `digests` function, run by bash with a stand-in kubectl that prints training logs shaped as
    examples/pytorch/ddp.py prints them: a rank that finished in a previous container run counts, one still
    training does not."""
    line = "final parameters digest {digest} identical-across-ranks={same}"
    assert f'print(f"{line}", flush=True)' in (REPO / "examples" / "pytorch" / "ddp.py").read_text()
    logs = {
        ("ddp-0", ""): "rank 0/4 on ddp-0: training\nepoch 1 loss 0.5\n" + line.format(digest="ab12", same=True),
        ("ddp-1", ""): line.format(digest="ab12", same=True),
        ("ddp-2", "--previous"): "[default0]:" + line.format(digest="ab12", same=True),
        ("ddp-3", ""): "rank 3/4 on ddp-3: training",
    }
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    cases = "\n".join(f'  "{pod} {flag}") printf "%s\\n" {shlex.quote(text)} ;;' for (pod, flag), text in logs.items())
    kubectl.write_text("#!/bin/bash\n# kubectl -n NS logs [--previous] POD -c trainer\n"
                       'args=("$@"); prev=""; for a in "${args[@]}"; do [[ $a == --previous ]] && prev=--previous; done\n'
                       'pod=$(printf "%s\\n" "${args[@]}" | grep "^ddp-")\n'
                       f'case "$pod $prev" in\n{cases}\n  *) exit 1 ;;\nesac\n')
    kubectl.chmod(0o755)
    function = re.search(r"^digests\(\) \{.*?^\}$", E2E.read_text(), re.S | re.M).group(0)
    done = subprocess.run(["bash", "-c", f"set -euo pipefail\nTRAINING_NAMESPACE=e2e\n{function}\ndigests"],
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["ab12", "ab12", "ab12"]  # ddp-3 has not finished
