"""Imports run one way: no module of ddplab imports, at any depth or inside a function, one that imports it back.

A cycle is where a layer reaches up (the public train() once lived in the worker body and called up into the
launcher; the planner read runs through the report). The package's root (`ddplab/__init__.py`, the lazy public
facade) and imports for type checkers only (`if TYPE_CHECKING:`) are left out.
"""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def module_names() -> dict[str, Path]:
    found = {}
    for path in (SRC / "ddplab").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def runtime_imports(tree: ast.AST) -> list[ast.AST]:
    """Import statements, those under `if TYPE_CHECKING:` left out."""
    found: list[ast.AST] = []

    def walk(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                walk(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            walk(child)

    walk(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in runtime_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ddplab"):
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules]
                targets = subs if len(subs) == len(node.names) else [node.module, *subs]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in modules and t not in (name, "ddplab")}
    graph.pop("ddplab", None)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\nelse:\n    import y\n"
        "def f():\n    import z\n"
    )
    assert [ast.unparse(n) for n in runtime_imports(tree)] == [
        "from typing import TYPE_CHECKING",
        "import y",
        "import z",
    ]


def test_no_module_imports_one_that_imports_it_back():
    graph = import_graph()
    assert len(graph) > 80 and "ddplab.launch" in graph["ddplab.cli"]  # every module, lazy imports counted
    found = cycles(graph)
    assert not found, "\n".join(
        " <-> ".join(c) + ": " + "; ".join(f"{m} imports {sorted(graph[m] & set(c))}" for m in c) for c in found
    )


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between layers: each subpackage (engine, sweep, report, planner, ...) and each top-level module."""

    def layer(name: str) -> str:
        return ".".join(name.split(".")[:2])

    out: dict[str, set[str]] = {}
    for name, targets in graph.items():
        out.setdefault(layer(name), set()).update(layer(t) for t in targets if layer(t) != layer(name))
    return out


def test_no_layer_imports_one_that_imports_it_back():
    """Packages too: the report reads the planner's links, so the planner must not read runs through the report."""
    layers = package_graph(import_graph())
    assert {"ddplab.report", "ddplab.planner", "ddplab.sweep", "ddplab.engine"} <= set(layers)
    found = cycles(layers)
    assert not found, "\n".join(
        " <-> ".join(c) + ": " + "; ".join(f"{m} imports {sorted(layers[m] & set(c))}" for m in c) for c in found
    )
