"""The package's import graph: no cycles, and no import running back up the layers.

Every import counts, including ``TYPE_CHECKING`` blocks and imports inside functions: a cycle
hidden in either is still two modules that cannot be understood (or split) one at a time.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "python"
#: Every unit of the package (``servo.X``, and the package's facade ``servo`` itself), lowest first:
#: a module may import its own layer and those below, never one above.
LAYERS = (
    # foundations: the Rust core, the error tree, logs, configuration files, private files, threads
    (
        "servo._core",
        "servo._exports",
        "servo.errors",
        "servo.logs",
        "servo.config",
        "servo.private_files",
        "servo.home",
        "servo.stages",
        "servo.httpd",
        "servo.systemd",
        "servo.threat_model",
    ),
    # the protocol: messages and keys, identities, join tokens, access roles, recordings
    ("servo.wire", "servo.identity", "servo.join", "servo.access", "servo.recording"),
    # Zenoh: settings, Zenoh sessions, QoS, queries
    ("servo.transport",),
    # what a server is built from: robots, policies, the router
    ("servo.robots", "servo.policy", "servo.router"),
    # the two ends of a servo session
    ("servo.server", "servo.client"),
    # what runs on them: the edge, the frontends, deployments, the fleet monitor, offline tools
    ("servo.edge", "servo.frontends", "servo.deploy", "servo.monitor", "servo.trace", "servo.lerobot_dataset"),
    # entry points: the command-line tools and the public names (``servo.X``)
    ("servo.cli", "servo"),
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


def unit(module: str) -> str:
    """The unit of the layering a module belongs to: ``servo.X`` (or ``servo``, the facade)."""
    return ".".join(module.split(".")[:2])


def layer(module: str) -> int | None:
    for index, units in enumerate(LAYERS):
        if unit(module) in units:
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


def test_every_unit_of_the_package_is_placed_once() -> None:
    placed = [name for units in LAYERS for name in units]
    assert len(placed) == len(set(placed))
    compiled = {".".join(p.relative_to(PACKAGE_ROOT).with_suffix("").parts) for p in PACKAGE_ROOT.rglob("*.pyi")}
    units = {unit(module) for module in module_graph().keys() | compiled}
    assert "servo.cli" in units
    assert sorted(units - set(placed)) == []  # a new unit needs a layer
    assert sorted(set(placed) - units) == []  # a unit gone leaves no stale entry


def test_the_checks_see_a_cycle_and_an_upward_import() -> None:
    graph = {
        "servo.client.a": {"servo.client.b"},
        "servo.client.b": {"servo.client.a", "servo.edge.x"},
        "servo.edge.x": set(),
    }
    assert cycles(graph) == [["servo.client.a", "servo.client.b"]]
    assert layer("servo.edge.x") > layer("servo.client.b")  # type: ignore[operator]
    assert layer("servo") == layer("servo.cli.serve") > layer("servo.errors") == layer("servo._core") == 0
    assert layer("servo.nope") is None


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
