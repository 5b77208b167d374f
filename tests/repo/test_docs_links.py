"""Every docs page is reachable from the README, and every relative link resolves (issue 24, item 6).

The docs are split by reader (docs/use, docs/operate, docs/develop) and the README's "Documentation" index is
the one way in: a page no chain of links reaches from README.md is a page nobody finds (the gang lifecycle page
was cited from code six times and listed nowhere). And a relative link into a renamed or moved page breaks
silently on GitHub. So this test follows the links from README.md through every page they reach, and checks
every relative link of README.md and docs/**/*.md against the files on disk (anchors are not checked).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# `[text](target)`; the target may start on the next line (a wrapped link), and may carry an anchor.
LINK = re.compile(r"\]\(\s*([^)\s]+)\)")
FENCE = re.compile(r"^\s*```.*?^\s*```", re.S | re.M)


def pages() -> list[Path]:
    return sorted((ROOT / "docs").rglob("*.md"))


def relative_links(page: Path) -> list[tuple[str, Path]]:
    """(target as written, the file or folder it names) for every relative link outside code blocks."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    found = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL, or an anchor on the same page
        path = target.split("#", 1)[0]
        found.append((target, (page.parent / path).resolve()))
    return found


def reachable() -> set[Path]:
    """Every markdown file reached from README.md by following relative links (a folder link reaches nothing)."""
    seen, todo = {README.resolve()}, [README.resolve()]
    while todo:
        for _, target in relative_links(todo.pop()):
            if target.suffix == ".md" and target.is_file() and target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_every_relative_link_resolves():
    broken = [f"{page.relative_to(ROOT)}: ({target})" for page in [README, *pages()]
              for target, path in relative_links(page) if not path.exists()]
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_every_docs_page_is_reachable_from_the_readme():
    assert len(pages()) > 20, pages()  # the walk really sees the docs tree
    seen = reachable()
    unreached = [str(page.relative_to(ROOT)) for page in pages() if page.resolve() not in seen]
    assert not unreached, "docs pages no link from README.md leads to:\n" + "\n".join(unreached)


# Pages other work was editing while the rest moved; they go to use/ (contract, delivery) and develop/
# (performance, with its two images). Empty this set when they move.
NOT_YET_MOVED: set[str] = set()


def test_docs_are_filed_by_reader():
    """Every page lies in the folder of its reader: use, operate or develop."""
    misplaced = [str(page.relative_to(ROOT)) for page in pages()
                 if page.relative_to(ROOT / "docs").parts[0] not in ("use", "operate", "develop", *NOT_YET_MOVED)]
    assert not misplaced, misplaced


def test_the_checks_catch_a_broken_and_an_unlinked_page(tmp_path):
    """The link resolver really follows wrapped links and anchors, and reports a missing target."""
    page = tmp_path / "docs" / "use" / "a.md"
    page.parent.mkdir(parents=True)
    (tmp_path / "docs" / "use" / "b.md").write_text("# b\n")
    page.write_text("see [b](\nb.md#x), [gone](../gone.md), [web](https://x.dev/a.md), [here](#top)\n"
                    "```\n[not a link](nowhere.md)\n```\n")
    links = relative_links(page)
    assert [target for target, _ in links] == ["b.md#x", "../gone.md"]
    assert [path.exists() for _, path in links] == [True, False]


ARCHITECTURE = ROOT / "docs" / "develop" / "architecture.md"
TOP_FOLDERS = ("webhook/", "launcher/", "trainhook/", "certs/", "charts/", "tests/", "hack/", "bench/", "examples/")


def named_code(text: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The repository paths architecture.md names in code spans, and (file, name) for each name it places in a
    file (`` `webhook/admission/pods.py` `set_env`, `gang_env` ``: set_env and gang_env are defined in webhook/admission/pods.py)."""
    paths = [p for p in re.findall(r"`([^`\s<>]+)`", text) if p.startswith(TOP_FOLDERS)]
    bare = [p for p in re.findall(r"`([\w/.-]+\.(?:py|c|yaml))`", text) if not p.startswith(TOP_FOLDERS)]
    assert not bare, f"name files by their path from the repository root: {bare}"
    placed = []
    for path, names in re.findall(r"`([\w/.*-]+\.py)`((?:,? `[A-Za-z_][\w.]*`)+)", text):
        placed += [(path, name) for name in re.findall(r"`([\w.]+)`", names) if not name.endswith(".py")]
    return paths, placed


def test_the_architecture_map_names_what_exists():
    """docs/develop/architecture.md is the newcomer's map from each promise of the contract to its code and tests:
    every file, folder and test it names exists, and every function or class it places in a file is defined there,
    so a move or a rename that forgets the map fails here."""
    paths, placed = named_code(ARCHITECTURE.read_text(encoding="utf-8"))
    assert len(paths) > 100 and len(placed) > 30, (len(paths), len(placed))
    missing = [p for p in paths if not list(ROOT.glob(p.rstrip("/")))]
    assert not missing, f"architecture.md names paths that do not exist: {missing}"
    undefined = []
    for path, name in placed:
        sources = "".join(f.read_text(encoding="utf-8") for f in ROOT.glob(path))
        last = name.split(".")[-1]
        if not re.search(rf"^\s*(async def|def|class) {re.escape(last)}\b|^{re.escape(last)}\s*[:=]", sources, re.M):
            undefined.append(f"{path}: {name}")
    assert not undefined, f"architecture.md places names where they are not defined: {undefined}"


def test_the_map_check_reads_paths_and_placed_names():
    paths, placed = named_code("`webhook/admission/pods.py` `set_env`, `gang_env` and `launcher/gone.py` or `trainhook.gang.keys`")
    assert paths == ["webhook/admission/pods.py", "launcher/gone.py"]
    assert placed == [("webhook/admission/pods.py", "set_env"), ("webhook/admission/pods.py", "gang_env")]
