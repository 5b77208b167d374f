"""Every `trainhook`, `trainhook-launch` and `make` command the docs show exists as shown (issue 25, item 6).

A reader copies commands from README.md and docs/: a subcommand, flag, choice or make target the code does not
have is a broken promise found only when it fails in their terminal. This test extracts every such command line
from the fenced code blocks and the inline code spans of README.md and docs/**/*.md and checks each word against
the real argparse parsers (trainhook/cli.py, launcher/cli.py, trainhook/local/scale_cli.py) and the Makefile's
targets, so a doc that shows a flag the CLI lacks fails here, naming the file, the command and the word.

Usage notation is understood (`[--wait]`, `(-f MANIFEST | NAME)`, `--kind statefulset|job`, `NAME`, `...`);
console blocks (and plain blocks holding `$ ` lines) count only their `$ ` lines (the rest is output); in plain and
sh blocks every line that starts with a program is a command, except a program's own output such as `trainhook
local: gang ...`. A plain block of output whose wrapped text starts a line with `make` is labeled `text`.
"""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from trainhook import cli as trainhook_cli
from trainhook.launcher import cli as launcher_cli
from trainhook.local import scale_cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PROGRAMS = ("trainhook", "trainhook-launch", "make")
# Fenced blocks whose lines are commands (all of them, or only `$ ` lines for console); others are data/output.
COMMAND_LANGUAGES = ("", "sh", "bash", "shell")
CONSOLE_LANGUAGES = ("console",)
# trainhook-launch subcommands whose arguments belong to the command they start (launcher/cli.py PASSTHROUGH).
LAUNCH_PASSTHROUGH = launcher_cli.PASSTHROUGH
SEPARATORS = {"|", "||", "&&", ";", "&"}


@dataclass(frozen=True)
class Shown:
    where: str  # docs/use/local.md:4
    text: str  # the command as the doc shows it


def _fenced_commands(path: Path, lines: list[str]) -> list[Shown]:
    shown, language, pending, start, wrapped = [], None, "", 0, 0
    where = str(path.relative_to(ROOT))
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            language = stripped[3:].strip().lower() if language is None else None
            if language == "" and _is_transcript(lines[number:]):
                language = "console"
            continue
        if language is None:
            continue
        stripped = stripped[len("sudo "):] if stripped.startswith("sudo ") else stripped
        follows = shown and shown[-1].where == f"{where}:{number - 1 - wrapped}"
        if not pending and language not in CONSOLE_LANGUAGES and follows and line.startswith((" ", "\t")) and stripped:
            # A usage line wrapped as argparse wraps it: the indented line goes on with the command above.
            shown[-1] = Shown(shown[-1].where, f"{shown[-1].text} {stripped}")
            wrapped += 1
            continue
        wrapped = 0
        if pending:  # a continuation (`\` at the end of the previous line)
            pending += " " + stripped.lstrip("> ")
        elif language in CONSOLE_LANGUAGES and stripped.startswith("$ "):
            pending, start = stripped[2:], number
        elif language in COMMAND_LANGUAGES and _is_command_line(stripped):
            pending, start = stripped, number
        else:
            continue
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        shown.append(Shown(f"{where}:{start}", pending))
        pending = ""
    return shown


def _is_transcript(rest: list[str]) -> bool:
    """A plain block holding `$ ` lines is a console transcript: its other lines are output."""
    body = []
    for line in rest:
        if line.strip().startswith("```"):
            break
        body.append(line.strip())
    return any(line.startswith("$ ") for line in body)


def _is_command_line(line: str) -> bool:
    """Starts with one of PROGRAMS and is not a program's own output (`trainhook local: gang ...`)."""
    words = line.split()
    return bool(words) and words[0] in PROGRAMS and not any(word.endswith(":") for word in words[:2])


def _inline_commands(path: Path, text: str) -> list[Shown]:
    outside = re.sub(r"^\s*```.*?^\s*```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)
    shown = []
    for match in re.finditer(r"`([^`]+)`", outside):
        span = " ".join(match.group(1).split())
        if span.split(" ", 1)[0] in PROGRAMS:
            line = outside.count("\n", 0, match.start()) + 1
            shown.append(Shown(f"{path.relative_to(ROOT)}:{line}", span))
    return shown


def shown_commands() -> list[Shown]:
    shown = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        shown += _fenced_commands(path, text.splitlines()) + _inline_commands(path, text)
    return shown


def _synopsis(text: str) -> str:
    """A synopsis line's command without its description column (`trainhook list      the gangs of ...`)."""
    return re.split(r"\s{3,}", text, maxsplit=1)[0]


def _tokens(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:  # an unbalanced quote in prose: plain words are enough to check the flags
        return text.split()


def segments(text: str) -> list[list[str]]:
    """The pipeline's commands that start with one of PROGRAMS, as word lists; redirections dropped.

    A `|` inside parentheses is usage notation's alternative (`(-f MANIFEST | NAME ...)`), not a pipe."""
    found, current, depth, skip_next = [], [], 0, False
    for token in _tokens(_synopsis(text)):
        if skip_next:
            skip_next = False
            continue
        if token in SEPARATORS and depth == 0:
            found.append(current)
            current = []
            continue
        if re.fullmatch(r"\d?[<>]{1,2}(&\d)?", token):
            skip_next = not token.endswith(("&1", "&2"))
            continue
        depth += token.count("(") - token.count(")")
        current.append(token)
    found.append(current)
    return [words for words in found if words and words[0] in PROGRAMS]


def _words(words: list[str]) -> list[list[str]]:
    """Each word's alternatives, usage brackets removed: `[--kind` -> ['--kind'], `env|yaml]` -> ['env', 'yaml']."""
    out = []
    for word in words:
        bare = word.strip("[]()")
        if bare in ("", "|", "...", "…"):
            continue
        out.append([part for part in bare.split("|") if part])
    return out


def _is_placeholder(word: str) -> bool:
    """NAME, N, ROLE=N, <job>, SECONDS, `...`: the doc names a value, not a literal to check."""
    return not re.search(r"[a-z]", re.sub(r"<[^>]*>", "", word)) or "..." in word


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def check_flags(parser: argparse.ArgumentParser, words: list[list[str]], command: str,
                stop_at_dashes: bool) -> list[str]:
    """Every option word is one of parser's options; an option's literal choice is one of its choices."""
    problems = []
    for position, alternatives in enumerate(words):
        for word in alternatives:
            if word == "--":
                if stop_at_dashes:
                    return problems
                continue
            if not word.startswith("-") or word == "-":
                continue
            name = word.split("=", 1)[0]
            action = parser._option_string_actions.get(name)
            if action is None:
                problems.append(f"`{command}` has no option {name}")
                continue
            value = word.split("=", 1)[1] if "=" in word else None
            values = [value] if value is not None else (words[position + 1] if position + 1 < len(words) else [])
            if action.choices and action.nargs != 0:
                for choice in values:
                    if not choice.startswith("-") and not _is_placeholder(choice) and choice not in action.choices:
                        problems.append(f"`{command} {name}` takes {', '.join(map(str, action.choices))}, not "
                                        f"{choice!r}")
    return problems


def check_trainhook(program: str, words: list[list[str]]) -> list[str]:
    parser = trainhook_cli.build_parser() if program == "trainhook" else launcher_cli.build_parser()
    command = program
    while True:
        commands = _subparsers(parser)
        if commands is None or not words or words[0][0].startswith("-") or _is_placeholder(words[0][0]):
            break
        name = words[0][0]
        if name in commands.choices:
            parser = commands.choices[name]
        elif commands.required or command != program:
            return [f"`{command}` has no subcommand {name!r} (it has: {', '.join(commands.choices)})"]
        else:
            break
        command += f" {name}"
        words = words[1:]
        if program == "trainhook-launch" and name in LAUNCH_PASSTHROUGH:
            return []  # the rest is the wrapped command's, not ours
        if command == "trainhook local" and words and words[0][0] in ("scale", "delete"):
            # `trainhook local scale|delete` have their own parsers (trainhook/cli.py main dispatches them first).
            parser = scale_cli.parser() if words[0][0] == "scale" else scale_cli.delete_parser()
            command += f" {words[0][0]}"
            words = words[1:]
            break
        if _subparsers(parser) is None:
            break
    taking_command = program == "trainhook" and command.split(" ")[1:2] and command.split(" ")[1] in \
        trainhook_cli.COMMAND_TAKING
    return check_flags(parser, words, command, stop_at_dashes=bool(taking_command))


def make_targets() -> set[str]:
    targets = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.%/$() -]+?)\s*:(?!=)", line)
        if match and not line.startswith((" ", "\t", "#")):
            targets.update(word for word in match.group(1).split() if not word.startswith((".", "$")))
    return targets


def check_make(words: list[list[str]]) -> list[str]:
    targets = make_targets()
    problems = []
    for alternatives in words:
        for word in alternatives:
            if word.startswith("-") or "=" in word:
                continue
            if word not in targets:
                problems.append(f"the Makefile has no target {word!r}")
    return problems


def check(text: str) -> list[str]:
    """What is wrong with one shown command line (empty: every subcommand, flag, choice and target exists)."""
    problems = []
    for words in segments(text):
        program, rest = words[0], _words(words[1:])
        if program == "make":
            problems += check_make(rest)
        elif rest:  # the bare program name is prose, not a command
            problems += check_trainhook(program, rest)
    return problems


def test_every_command_the_docs_show_exists():
    shown = shown_commands()
    # The extractor really reads the docs: the quick start, the local usage line, render's example, convert's.
    texts = {item.text for item in shown}
    assert "make demo" in texts and any(t.startswith("trainhook local MANIFEST") for t in texts)
    assert any(t.startswith("trainhook render ddp --workers 4") for t in texts), texts
    assert len(shown) > 150, len(shown)
    problems = [f"{item.where}: {item.text!r}: {problem}" for item in shown for problem in check(item.text)]
    assert not problems, "\n".join(problems)


def test_the_checker_catches_what_the_cli_lacks():
    """A doc that shows a missing flag, subcommand, choice or target fails; usage notation and output do not."""
    assert check("trainhook local ddp.yaml --keep-dirs") == ["`trainhook local` has no option --keep-dirs"]
    assert check("trainhook convert job.yaml --kind pod")[0].startswith("`trainhook convert --kind` takes")
    assert check("trainhook lgos mnist")[0].startswith("`trainhook` has no subcommand 'lgos'")
    assert check("trainhook local scale /tmp/x statefulset/a --replica 3") == [
        "`trainhook local scale` has no option --replica"]
    assert check("trainhook-launch wait --instal DIR") == ["`trainhook-launch wait` has no option --instal"]
    assert check("make demo && make tests") == ["the Makefile has no target 'tests'"]
    assert check("kubectl get pods | trainhook explain - -o json")[0].startswith("`trainhook explain -o` takes")
    # Usage notation, pipes, redirections, the training command after `--`, and wrapped commands pass.
    assert check("trainhook submit (-f MANIFEST | NAME [flags] -- CMD ARGS) [--wait]") == []
    assert check("trainhook render ddp --workers 4 -- torchrun train.py --epochs 3 > ddp.yaml") == []
    assert check("trainhook convert FILE [--kind statefulset|job] [-n NS] [-o OUT]") == []
    assert check("trainhook-launch torchrun --nproc-per-node 2 train.py") == []
    assert check("trainhook-launch mpi-worker -- /usr/sbin/sshd -De") == []
    # A program's own output in a plain block is not a command; a console block's output lines are not either.
    lines = ["```", "trainhook local: gang default/gang failed (exit 3)", "```",
             "```console", "$ trainhook logs mnist \\", "    -f", "trainhook status --nope", "```"]
    found = _fenced_commands(ROOT / "docs" / "x.md", lines)
    assert [item.text for item in found] == ["trainhook logs mnist -f"]
    assert check(found[0].text) == []
    # A usage line wrapped onto an indented line is checked whole.
    wrapped = _fenced_commands(ROOT / "docs" / "x.md", ["```", "trainhook local M [--timeout S]", "  [--nope]", "```"])
    assert check(wrapped[0].text) == ["`trainhook local` has no option --nope"]


def section_flags(path: Path) -> list[tuple[str, str, str]]:
    """(section heading, where, flag) for every inline code span that starts with a flag (`--workers N`)."""
    found, heading = [], ""
    text = re.sub(r"^\s*```.*?^\s*```", lambda m: "\n" * m.group(0).count("\n"), path.read_text(), flags=re.S | re.M)
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("## "):
            heading = line[3:]
        for span in re.findall(r"`(-[^`]*)`", line):
            flag = span.split()[0].split("=")[0]
            if flag not in ("-", "--"):
                found.append((heading, f"{path.relative_to(ROOT)}:{number}", flag))
    return found


def test_the_flags_cli_md_names_in_each_section_belong_to_its_subcommands():
    """cli.md's tables and prose name flags one by one (`--gang-scheduler`, `-c`, `--tail N`): each is an option
    of a subcommand its section is about (`## submit, status, list, logs, delete`: one of those five)."""
    commands = _subparsers(trainhook_cli.build_parser()).choices
    problems, checked = [], 0
    for heading, where, flag in section_flags(ROOT / "docs" / "use" / "cli.md"):
        names = [word for word in re.findall(r"[\w-]+", heading) if word in commands]
        if not names:
            continue
        checked += 1
        if not any(flag in commands[name]._option_string_actions for name in names):
            problems.append(f"{where}: {flag} is no option of {', '.join(names)}")
    assert checked > 25, checked
    assert not problems, "\n".join(problems)


def test_local_usage_line_shows_every_option():
    """docs/use/local.md's usage line is the reader's whole view of `trainhook local`: no flag may be missing."""
    usage = next(item.text for item in shown_commands()
                 if item.where.startswith("docs/use/local.md") and item.text.startswith("trainhook local MANIFEST"))
    local = _subparsers(trainhook_cli.build_parser()).choices["local"]
    options = {action.option_strings[-1] for action in local._actions if action.option_strings} - {"--help"}
    missing = sorted(option for option in options if not re.search(rf"(^|[\s\[]){re.escape(option)}\b", usage)
                     and not any(re.search(rf"(^|[\s\[]){re.escape(o)}\b", usage)
                                 for o in next(a for a in local._actions if option in a.option_strings).option_strings))
    assert not missing, f"docs/use/local.md's usage line lacks {missing}: {usage}"
