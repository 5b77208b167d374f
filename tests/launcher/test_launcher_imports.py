"""launcher/ has no import cycle, at module level or inside functions (issue 24: the launcher untangled).

Why: a cycle is how the process toolkit and the commands got tangled before (run.py was both, and gang_run.py and
ending.py imported it back), and a function-level import only hides a cycle from the interpreter, not from a
reader. The graph is built from the source with `ast`: every `import` and `from` anywhere in a module (in a
function, under `if TYPE_CHECKING:` too), relative imports resolved, restricted to launcher/'s own modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

LAUNCHER = Path(__file__).resolve().parents[2] / "launcher"
PACKAGE = "trainhook.launcher"


def imports_of(tree: ast.Module, package: str = PACKAGE) -> set[str]:
    """The launcher modules (short names) that an import anywhere in `tree` loads."""
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
            if name.startswith(PACKAGE + ".") and name.count(".") == 2:
                found.add(name.rsplit(".", 1)[1])
    return found


def graph(folder: Path = LAUNCHER) -> dict[str, set[str]]:
    modules = {path.stem: path for path in folder.glob("*.py")}
    edges = {}
    for name, path in modules.items():
        edges[name] = {m for m in imports_of(ast.parse(path.read_text())) if m in modules and m != name}
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
    assert len(edges) > 20 and "process" in edges["gang_run"], "the graph was built"
    assert cycles(edges) == [], "launcher/ imports in a cycle (module or function level)"


def test_the_scan_sees_function_level_relative_and_type_checking_imports():
    tree = ast.parse("from trainhook.launcher import run as r, gang\nimport trainhook.launcher.wait\n"
                     "def f():\n    from trainhook.launcher.ending import end_member\n"
                     "    from .reach import connect_peer\n"
                     "if TYPE_CHECKING:\n    from trainhook.launcher.coordinator import Coordinator\n"
                     "from trainhook import keys\nimport json\n")
    assert imports_of(tree) == {"run", "gang", "wait", "ending", "reach", "coordinator"}


def test_a_cycle_is_found_through_any_length():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []
    assert cycles({"run": {"gang_run"}, "gang_run": {"run"}}) == [["gang_run", "run", "gang_run"]]
