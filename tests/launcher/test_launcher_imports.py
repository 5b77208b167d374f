"""launcher/ (with its rooms coordination/, mpi/, wait/) has no import cycle, at module level or inside functions,
and its names are unique enough to grep (issue 24: the launcher untangled).

Why: a cycle is how the process toolkit and the commands got tangled before (run.py was both, and gang_run.py and
ending.py imported it back), and a function-level import only hides a cycle from the interpreter, not from a
reader. The graph is built from the source with `ast`: every `import` and `from` anywhere in a module (in a
function, under `if TYPE_CHECKING:` too), relative imports resolved, restricted to launcher/'s own modules, each named by its path under launcher/ (`coordination.member_run`).

Names: a function or class defined in two launcher modules (`connect`, `fail`, `Refused` were, each twice) makes a
grep for it, a traceback or a review name the wrong one; so does a launcher class named as a class elsewhere in the
product (the launcher's `Notary` client beside the webhook's `Notary`). The same `ast` scan lists every top-level
def and class; `main`, each command module's entry point, is the one name every module may have.
"""

from __future__ import annotations

import ast
import shutil
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "trainhook" / "launcher"
PACKAGE = "trainhook.launcher"
# The product's other packages (trainhook.webhook, trainhook.certs and the rest of trainhook), the launcher left out.
PRODUCT = (ROOT / "trainhook",)
SHARED_NAMES = {"main"}


def module_name(path: Path, folder: Path) -> str:
    """A launcher module's name under launcher/: `ending`, `coordination.member_run`, `mpi` (a package's __init__)."""
    parts = path.relative_to(folder).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(tree: ast.Module, package: str = PACKAGE) -> set[str]:
    """The launcher modules (names under launcher/) that an import anywhere in `tree` loads: `from P import N`
    counts P and P.N (which is a module when P is a package); the caller keeps the ones that exist."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith(PACKAGE + "."):
                found.add(name[len(PACKAGE) + 1:])
    return found


def graph(folder: Path = LAUNCHER) -> dict[str, set[str]]:
    modules = {module_name(path, folder): path for path in folder.rglob("*.py") if "__pycache__" not in path.parts}
    edges = {}
    for name, path in modules.items():
        package = f"{PACKAGE}.{name}" if path.name == "__init__.py" else f"{PACKAGE}.{name}".rpartition(".")[0]
        edges[name] = {m for m in imports_of(ast.parse(path.read_text()), package) if m in modules and m != name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle found by a depth-first search (one per back edge), as the path that closes it."""
    found, state, path = [], {}, []

    def visit(node: str) -> None:
        state[node], path[len(path):] = "open", [node]
        for target in sorted(edges.get(node, ())):
            if state.get(target) == "open":
                found.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target)
        state[node] = "done"
        path.pop()

    for node in sorted(edges):
        if node not in state:
            visit(node)
    return found


def test_the_launcher_imports_form_no_cycle():
    edges = graph()
    assert len(edges) >= 40 and "process" in edges["coordination.member_run"], "the graph was built"
    assert "mpi.control" in edges["mpi.launch"] and "wait.dns" in edges["wait.tcp"], "the rooms' modules are in it"
    assert cycles(edges) == [], "launcher/ imports in a cycle (module or function level)"


def test_the_scan_sees_function_level_relative_and_type_checking_imports():
    tree = ast.parse("from trainhook.launcher import run as r, gang\nimport trainhook.launcher.wait.command\n"
                     "def f():\n    from trainhook.launcher.ending import end_member\n"
                     "    from .reach import connect_peer\n"
                     "if TYPE_CHECKING:\n    from trainhook.launcher.coordination.coordinator import Coordinator\n"
                     "from trainhook import keys\nimport json\n")
    assert imports_of(tree) == {"run", "gang", "wait.command", "ending", "ending.end_member", "reach",
                                "reach.connect_peer", "coordination.coordinator", "coordination.coordinator.Coordinator"}


def test_a_cycle_is_found_through_any_length():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []
    assert cycles({"run": {"gang_run"}, "gang_run": {"run"}}) == [["gang_run", "run", "gang_run"]]



def top_level_names(folder: Path) -> dict[str, list[tuple[str, bool]]]:
    """name -> [(file under `folder`, whether it is a class)] for every top-level def and class of its modules."""
    found: dict[str, list[tuple[str, bool]]] = defaultdict(list)
    for path in sorted(folder.rglob("*.py")):
        if "__pycache__" not in path.parts:
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    found[node.name].append((path.relative_to(folder).as_posix(), isinstance(node, ast.ClassDef)))
    return found


def name_clashes(launcher: Path = LAUNCHER, product: tuple[Path, ...] = PRODUCT) -> list[str]:
    """A line for each name two launcher modules define (but `main`) and for each launcher class whose name a
    class of the product's other packages has."""
    ours = top_level_names(launcher)
    clashes = [f"{name} in {', '.join(file for file, _ in where)}" for name, where in sorted(ours.items())
               if len(where) > 1 and name not in SHARED_NAMES]
    theirs: dict[str, list[str]] = defaultdict(list)
    for folder in product:
        for name, where in top_level_names(folder).items():
            theirs[name] += [f"{folder.name}/{file}" for file, is_class in where
                             if is_class and not (folder / file).resolve().is_relative_to(LAUNCHER.resolve())]
    clashes += [f"class {name} in launcher/{file} and {', '.join(theirs[name])}" for name, where in sorted(ours.items())
                for file, is_class in where if is_class and theirs.get(name)]
    return clashes


def test_no_two_launcher_modules_define_a_name_and_no_launcher_class_borrows_a_product_class_name():
    ours = top_level_names(LAUNCHER)
    assert len(ours) > 200 and len(ours["main"]) > 5, "the scan sees launcher/'s defs, `main` in each command"
    assert "Notary" in top_level_names(ROOT / "trainhook" / "webhook"), "the scan sees the product's classes"
    assert name_clashes() == []


def test_the_name_check_catches_a_second_definition_and_a_borrowed_class_name(tmp_path):
    copy = tmp_path / "launcher"
    shutil.copytree(LAUNCHER, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert name_clashes(copy) == [], "the copy is as clean as launcher/"

    with open(copy / "coordination" / "member_run.py", "a") as module:
        module.write("\n\ndef main():\n    pass\n\n\ndef describe(peers):\n    return ''\n")
    with open(copy / "speak.py", "a") as module:
        module.write("\n\nclass Notary:\n    pass\n")
    assert name_clashes(copy) == ["describe in coordination/member_run.py, reach.py",
                                  "class Notary in launcher/speak.py and trainhook/webhook/notary/service.py"]
