"""The package's import graph: no cycles, and no import running back up the layers.

Every import counts, including ``TYPE_CHECKING`` blocks and imports inside functions: a cycle
hidden in either is still two modules that cannot be understood (or split) one at a time.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "python"
#: Lowest first: a module may import its own layer and those below, never one above.
LAYERS = (
    ("servo._core",),
    ("servo.wire",),
    ("servo.transport",),
    ("servo.server", "servo.client"),
    ("servo.edge", "servo.frontends"),
    ("servo.cli",),
)


def module_graph() -> dict[str, set[str]]:
    """Module -> the servo modules it imports."""
    paths = {}
    for path in PACKAGE_ROOT.rglob("*.py"):
        parts = path.relative_to(PACKAGE_ROOT).with_suffix("").parts
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    #: Modules with a stub instead of Python source (the Rust core).
    compiled = {".".join(p.relative_to(PACKAGE_ROOT).with_suffix("").parts) for p in PACKAGE_ROOT.rglob("*.pyi")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # ``from servo import _core`` depends on the submodule, not on the package's own
                # code (its public names): only names that are no module count as the package.
                submodules = {f"{node.module}.{alias.name}" for alias in node.names} & (paths.keys() | compiled)
                if len(submodules) < len(node.names):
                    imported.add(node.module)
                imported.update(submodules)
        graph[name] = {other for other in imported if other in paths and other != name}
    return graph


def layer(module: str) -> int | None:
    for index, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    return None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while (member := stack.pop()) != node:
                component.append(member)
            component.append(node)
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle() -> None:
    graph = module_graph()
    assert "servo.client.session" in graph
    assert cycles(graph) == []


def test_no_import_runs_back_up_the_layers() -> None:
    graph = module_graph()
    upward = [
        f"{module} imports {other}"
        for module, imports in graph.items()
        for other in imports
        if (mine := layer(module)) is not None and (theirs := layer(other)) is not None and theirs > mine
    ]
    assert upward == []


def test_the_checks_see_a_cycle_and_an_upward_import() -> None:
    graph = {
        "servo.client.a": {"servo.client.b"},
        "servo.client.b": {"servo.client.a", "servo.edge.x"},
        "servo.edge.x": set(),
    }
    assert cycles(graph) == [["servo.client.a", "servo.client.b"]]
    assert layer("servo.edge.x") > layer("servo.client.b")  # type: ignore[operator]


def test_tests_and_benches_never_import_each_other() -> None:
    # What both need lives in testbed/, which imports neither.
    root = PACKAGE_ROOT.parent
    forbidden = {"tests": ("benches",), "benches": ("tests",), "testbed": ("tests", "benches")}
    crossing = []
    for tree, others in forbidden.items():
        for path in (root / tree).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                crossing += [f"{path.relative_to(root)} imports {n}" for n in names if n.split(".")[0] in others]
    assert crossing == []
