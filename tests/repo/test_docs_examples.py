"""The docs' examples run, not only parse (issue 34, section 3).

tests/repo/test_docs_commands.py checks that every command the docs show names real subcommands and flags; a
command can pass that and still fail in the reader's terminal (an input that does not exist, a refusal, output
the webhook would deny). So here:

- every `trainhook render|convert|explain` line of a fenced block in README.md and docs/ runs for real, as a
  subprocess of the installed CLI in a scratch directory holding `examples/`, and must exit 0, or the code its
  comment shows (`# ... exit 1`). An input the doc names by a bare file name that exists once under examples/
  (`pytorchjob.yaml`) is that file; an input the repository does not have (`job.yaml`, the reader's own) is not
  run, and said why. What render and convert print is then admitted by `trainhook explain` and its objects
  validated against Kubernetes' schemas;
- the commands that need a cluster or root are not run here, each for the reason in NOT_RUN (the test fails on a
  subcommand shown in the docs that has no reason);
- every YAML block in docs/use that holds whole Kubernetes objects is validated (Kubernetes' kinds strictly, the
  schedulers' PodGroups under their CRDs); a block the doc abridges (`...`) or that is a fragment is not;
- docs/operate/webhook.md's flag table is the webhook's real parser (`trainhook-webhook --help`): every flag,
  and the environment variable its help names.

The extraction of fenced commands is test_docs_commands.py's, so both tests read the same lines.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml
from rendered import validate_objects
from test_docs_commands import DOCS, ROOT, Shown, _fenced_commands, _synopsis

BIN = Path(sys.executable).parent
RUN = ("render", "convert", "explain", "--version")
PRINTS_MANIFESTS = ("render", "convert")
NOT_RUN = {
    "local": "needs root and network namespaces (tests/local runs it)",
    "submit": "creates objects on a cluster (tests/cluster, tests/e2e)",
    "status": "reads a cluster (tests/cluster, tests/e2e)",
    "list": "reads a cluster (tests/cluster, tests/e2e)",
    "logs": "reads a cluster (tests/cluster, tests/e2e)",
    "delete": "deletes from a cluster (tests/cluster, tests/e2e)",
    "certs": "writes certificates (tests/repo/test_packaging.py runs it)",
}
USAGE = re.compile(r"^[\[(](?!\")|^[A-Z][A-Z_]*$|\.\.\.|\|")  # [--wait], (-f F | N), NAME, ..., env|yaml


@dataclass
class Plan:
    shown: Shown
    stages: list[list[str]]  # the trainhook pipeline to run; empty: not run
    output: str | None = None  # `> FILE`
    expected: int = 0
    reason: str = ""  # why it is not run


def plan(shown: Shown) -> Plan:
    """What of one shown line runs here, and what it must exit with."""
    comment = shown.text.split("#", 1)[1] if "#" in shown.text else ""
    expected = int(m.group(1)) if (m := re.search(r"\bexit (\d+)", comment)) else 0
    lexer = shlex.shlex(_synopsis(shown.text), posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split, lexer.commenters = True, "#"
    try:
        tokens = list(lexer)
    except ValueError:
        return Plan(shown, [], reason="not shell syntax")
    stages, current, output = [], [], None
    for i, token in enumerate(tokens):
        if token in (";", "&", "&&"):
            break  # one command a line in the docs: what follows is another's
        if token == "|":
            stages.append(current)
            current = []
        elif token in (">", ">>") and i + 1 < len(tokens):
            output = tokens[i + 1]
        elif not (i and tokens[i - 1] in (">", ">>")):
            current.append(token)
    stages.append(current)
    if not stages[0] or stages[0][0] != "trainhook":
        who = stages[0][0] if stages[0] else "nothing"
        return Plan(shown, [], reason=f"its input comes from {who}")
    ours = []
    for stage in stages:
        if stage[0] != "trainhook":
            break  # `| kubectl apply -f -`: the trainhook part runs, its output is checked below
        ours.append(stage)
    for stage in ours:
        command = stage[1] if len(stage) > 1 else ""
        if command not in RUN:
            return Plan(shown, [], reason=NOT_RUN.get(command, f"no reason given for `trainhook {command}`"))
        if any(USAGE.search(word) for word in stage[2:] if word != "--" and not word.startswith("--")):
            return Plan(shown, [], reason="a usage line")
    return Plan(shown, ours, output if len(ours) == len(stages) else None, expected)


def inputs(stages: list[list[str]]) -> list[str]:
    """The YAML files a pipeline reads: the positional arguments ending in .yaml."""
    found = []
    for stage in stages:
        for before, word in zip(stage[1:], stage[2:]):
            if word.endswith((".yaml", ".yml")) and before not in ("-o", "--output"):
                found.append(word)
    return found


def provide(workdir: Path, name: str) -> bool:
    """Make `name` readable in workdir: already there (an earlier command wrote it, or examples/), or the one file
    of that name under examples/. False: the repository does not have it."""
    if (workdir / name).exists():
        return True
    matches = sorted((ROOT / "examples").rglob(Path(name).name)) if "/" not in name else []
    if len(matches) != 1:
        return False
    shutil.copy(matches[0], workdir / name)
    return True


def cli(args: list[str], workdir: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(args, cwd=workdir, input=stdin, capture_output=True, text=True, env=env, timeout=60)


def execute(item: Plan, workdir: Path) -> list[str]:
    """Run one planned line; the problems found (empty: it did what the doc says)."""
    where = f"{item.shown.where}: {item.shown.text!r}"
    line = " | ".join(shlex.join(stage) for stage in item.stages)
    done = cli(["bash", "-o", "pipefail", "-c", line + (f" > {shlex.quote(item.output)}" if item.output else "")],
               workdir)
    if done.returncode != item.expected:
        return [f"{where}: exited {done.returncode}, the doc expects {item.expected}:\n{done.stderr[-2000:]}"]
    last = item.stages[-1][1]
    if item.expected or last not in PRINTS_MANIFESTS:
        return []
    printed = (workdir / item.output).read_text() if item.output else done.stdout
    objects = [doc for doc in yaml.safe_load_all(printed) if doc]
    if not objects:
        return [f"{where}: printed no manifests"]
    validate_objects(objects)
    explained = cli([str(BIN / "trainhook"), "explain", "-"], workdir, stdin=printed)
    if explained.returncode != 0:
        return [f"{where}: what it printed is refused by `trainhook explain -`:\n{explained.stderr[-2000:]}"]
    return []


def fenced() -> list[Shown]:
    return [item for path in DOCS for item in _fenced_commands(path, path.read_text(encoding="utf-8").splitlines())]


def test_every_render_convert_and_explain_the_docs_show_runs(tmp_path):
    plans = [plan(item) for item in fenced() if re.search(r"(^|\|\s*)trainhook\s", item.text)]
    ran, problems, not_run = [], [], []
    for page in sorted({item.shown.where.split(":")[0] for item in plans}):
        workdir = tmp_path / page.replace("/", "_")
        workdir.mkdir()
        (workdir / "examples").symlink_to(ROOT / "examples")
        for item in (p for p in plans if p.shown.where.split(":")[0] == page):
            missing = [name for name in inputs(item.stages) if not provide(workdir, name)]
            if not item.stages or missing:
                reason = item.reason or f"reads {', '.join(missing)}, which the repository does not have"
                not_run.append(f"{item.shown.where}: {item.shown.text[:70]!r}: {reason}")
                continue
            ran.append(f"{item.shown.where}: {item.shown.text[:70]!r}")
            problems += execute(item, workdir)
    print("ran:\n" + "\n".join(ran) + "\nnot run:\n" + "\n".join(not_run))
    assert not [line for line in not_run if "no reason given" in line], not_run
    assert len(ran) >= 10, (ran, not_run)  # cli.md, convert.md, migrating.md and the schedulers' pages at least
    assert not problems, "\n\n".join(problems)


def test_the_planner_runs_what_it_can_and_catches_a_failing_example(tmp_path):
    assert plan(Shown("x.md:1", "trainhook local examples/pytorch/ddp.yaml")).reason == NOT_RUN["local"]
    assert plan(Shown("x.md:1", "kubectl get pytorchjob mnist -o yaml | trainhook convert -")).reason == \
        "its input comes from kubectl"
    assert plan(Shown("x.md:1", "trainhook convert FILE [--kind statefulset|job]")).reason == "a usage line"
    assert plan(Shown("x.md:1", "trainhook lgos mnist")).reason.startswith("no reason given")
    applied = plan(Shown("x.md:1", "trainhook render a --workers 2 -- python t.py | kubectl apply -f -"))
    assert applied.stages == [["trainhook", "render", "a", "--workers", "2", "--", "python", "t.py"]]
    refused = plan(Shown("x.md:1", "trainhook explain bad.yaml   # refused, exit 1"))
    assert (refused.expected, refused.stages[0][-1]) == (1, "bad.yaml")
    # A bare input name is the one example of that name; the run then admits what convert printed.
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    converted = plan(Shown("x.md:1", "trainhook convert pytorchjob.yaml > mnist.yaml"))
    assert provide(tmp_path, "pytorchjob.yaml") and not provide(tmp_path, "job.yaml")
    assert execute(converted, tmp_path) == [] and (tmp_path / "mnist.yaml").exists()
    # A doc whose example fails is reported with the exit code and the CLI's message.
    wrong = plan(Shown("x.md:9", "trainhook render good --workers 2 -- python t.py"))
    wrong.stages[0][2] = "Bad_Name"
    (problem,) = execute(wrong, tmp_path)
    assert problem.startswith("x.md:9: ") and "the doc expects 0" in problem


def yaml_blocks() -> list[tuple[str, str]]:
    found = []
    for path in sorted((ROOT / "docs" / "use").rglob("*.md")):
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"^```ya?ml\s*\n(.*?)^```", text, flags=re.S | re.M):
            found.append((f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}", match.group(1)))
    return found


def is_kubernetes_kind(obj: dict) -> bool:
    group = obj["apiVersion"].rpartition("/")[0]
    return "." not in group or (group.endswith(".k8s.io") and not group.endswith(".x-k8s.io"))


def test_every_whole_kubernetes_object_in_docs_use_is_valid():
    validated, skipped = [], []
    for where, text in yaml_blocks():
        objects = [doc for doc in yaml.safe_load_all(text) if doc]
        whole = all(isinstance(o, dict) and {"apiVersion", "kind", "metadata"} <= set(o) for o in objects)
        if not whole or re.search(r"\.\.\.", text):
            skipped.append(f"{where}: a fragment or abridged")
            continue
        for obj in objects:
            if obj["kind"] == "PodGroup" or is_kubernetes_kind(obj):
                validate_objects([obj])
                validated.append(f"{where}: {obj['kind']}")
            else:
                skipped.append(f"{where}: {obj['apiVersion']} {obj['kind']}: no schema kept here")
    print("validated:", validated, "\nnot validated:", skipped)
    # The migration page's Service for a hard-coded host name, the HPA, an unlabeled StatefulSet, the PodGroups.
    assert any(v.startswith("docs/use/migrating.md") and v.endswith("Service") for v in validated), validated
    assert len(validated) >= 5, validated


def test_the_host_name_service_in_migrating_md_is_one_the_webhook_never_sees():
    """migrating.md says its extra Service is plain Kubernetes: no trainhook label, so the objectSelector skips it."""
    (service,) = [doc for where, text in yaml_blocks() if where.startswith("docs/use/migrating.md")
                  for doc in yaml.safe_load_all(text) if doc and doc["kind"] == "Service"]
    assert not [k for k in (service["metadata"].get("labels") or {}) if k.startswith("trainhook.dev/")]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True


def webhook_help() -> dict[str, str]:
    """{flag: its help text} from the real `trainhook-webhook --help`, with no TRAINHOOK_WEBHOOK_* set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINHOOK_WEBHOOK_")}
    done = subprocess.run([str(BIN / "trainhook-webhook"), "--help"], capture_output=True, text=True,
                          env={**env, "COLUMNS": "200"}, timeout=60)
    assert done.returncode == 0, done.stderr
    helps, current = {}, []
    for line in done.stdout.splitlines():
        if re.match(r"^  -", line):
            head, _, rest = line.strip().partition("  ")
            current = re.findall(r"(?:^|, )(--?[\w-]+)", head)
            for flag in current:
                helps[flag] = rest.strip()
        elif line.startswith("    ") and current:
            for flag in current:
                helps[flag] += " " + line.strip()
        else:
            current = []
    return helps


def doc_flags(path: Path, heading: str) -> dict[str, set[str]]:
    """{flag: the environment variables its row names} from the table under `heading` in `path`."""
    text = path.read_text(encoding="utf-8")
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `-"):
            cells = line.split("|")
            for flag in re.findall(r"`(--?[\w-]+)", cells[1]):
                rows[flag] = set(re.findall(r"TRAINHOOK_WEBHOOK_\w+", cells[2]))
    return rows


def test_the_webhook_flags_the_docs_list_are_the_parsers():
    helps = webhook_help()
    real = set(helps) - {"-h", "--help"}
    assert {"--notary-authority", "--gang-key-secret", "--cert-mode"} <= real, sorted(real)
    table = doc_flags(ROOT / "docs" / "operate" / "webhook.md", "## Flags")
    assert set(table) == real, f"webhook.md lacks {sorted(real - set(table))}, names {sorted(set(table) - real)}"
    problems = []
    for path, heading in ((ROOT / "docs" / "operate" / "webhook.md", "## Flags"),
                          (ROOT / "docs" / "operate" / "certificates.md", "## Server flags")):
        for flag, documented in doc_flags(path, heading).items():
            if flag not in real:
                problems.append(f"{path.name}: {flag} is no flag of trainhook-webhook")
                continue
            named = set(re.findall(r"TRAINHOOK_WEBHOOK_\w+", helps[flag]))
            first = re.search(r"env (TRAINHOOK_WEBHOOK_\w+)", helps[flag])
            if first and first.group(1) not in documented:
                problems.append(f"{path.name}: {flag}'s variable is {first.group(1)}, the doc says {documented}")
            if documented - named:
                problems.append(f"{path.name}: {flag}: its help names no {sorted(documented - named)}")
    assert not problems, "\n".join(problems)
