"""Imports run one way, and only along the edges written down here.

Each folder of src/ddplab (engine, rundir, launch, sweep, report, ...) is one layer, and so is each module at the
top level; a layer imports only the layers ALLOWED names for it, at any depth: inside a function and for type
checkers too. No module imports one that imports it back, no layer imports one that imports it back, and what a
layer loads when it is imported (its modules' module-level code included) stays inside what it may import. A new
edge is a decision, made here, where a reviewer sees it (in the spirit of torchtitan's frozen-API tests). A cycle
is where a layer reaches up (the public train() once lived in the worker body and called up into the launcher;
the planner read runs through the report; the MLflow sink started `ddplab report`). The package's root
(`ddplab/__init__.py`, the lazy public facade) is left out.
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# Each layer -> the layers it may import. Read bottom up: errors, the private-API list, the borders with files and
# programs (io/); the run's settings and the run folder's formats (rundir/); the metrics, the engine and what it
# runs on (torch); the planner (arithmetic, torch-free), the sweep's formats (sweepdir/), the report; the launcher
# (it starts the engine, and attaches a finished run's report to its tracker); the sweep (it starts launchers);
# the CLI on top.
# fmt: off
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "internals": set(),  # the private APIs of CPython, torch and numpy: reached by any layer through it alone
    "log": set(),
    "seeding": set(),
    "io": {"errors"},
    "stops": {"errors"},
    "models": {"errors"},
    "topology": {"errors"},
    "tracking": {"errors", "io"},
    "compat": {"errors", "internals", "stops"},
    "faults": {"errors", "topology"},
    "data": {"errors", "faults", "internals", "seeding"},
    "config": {"data", "errors", "io"},
    "machine": {"config", "topology", "tracking"},
    "rundir": {"config", "errors", "faults", "io", "machine", "topology"},
    "distributed": {"compat", "config", "errors", "internals", "io", "topology"},
    "metrics": {"config", "distributed", "io", "rundir", "topology", "tracking"},
    "kernels": {"io", "metrics", "models"},
    "engine": {
        "compat", "config", "data", "distributed", "errors", "faults", "internals", "io", "kernels", "log", "machine",
        "metrics", "models", "rundir", "seeding", "topology",
    },
    "planner": {"errors", "io", "rundir", "topology"},
    "sweepdir": {"config", "errors", "io", "metrics", "planner", "rundir"},
    "report": {"config", "errors", "io", "metrics", "planner", "rundir", "sweepdir", "topology"},
    "launch": {
        "compat", "config", "distributed", "engine", "errors", "faults", "internals", "io", "metrics", "planner",
        "report", "rundir", "stops", "topology", "tracking",
    },
    "sweep": {
        "config", "errors", "io", "launch", "machine", "planner", "report", "rundir", "stops", "sweepdir", "topology",
        "tracking",
    },
    "cli": {
        "compat", "config", "data", "engine", "errors", "faults", "internals", "io", "kernels", "launch", "models",
        "planner", "report", "rundir", "stops", "sweep", "sweepdir", "topology",
    },
    "__main__": {"cli", "errors"},
}
# fmt: on

# Edges that run back up, each with its reason: drawn with each layer as one box, none may appear but these.
UPWARD: dict[tuple[str, str], str] = {}


def layer(module: str) -> str:
    """A module's layer: its folder under ddplab/, or itself at the top level."""
    return module.split(".")[1]


def module_names() -> dict[str, Path]:
    found = {}
    for path in (SRC / "ddplab").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(tree: ast.AST) -> list[ast.AST]:
    """Every import statement: at the top, inside functions, and under `if TYPE_CHECKING:` (a type-only cycle is
    a cycle of meaning: two modules that each need the other's names to be read)."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in imports(ast.parse(path.read_text())):
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
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\ndef f():\n    import z\n")
    assert [ast.unparse(n) for n in imports(tree)] == ["from typing import TYPE_CHECKING", "import x", "import z"]


def test_no_module_imports_one_that_imports_it_back():
    graph = import_graph()
    assert (
        len(graph) > 80 and "ddplab.launch.elastic" in graph["ddplab.cli.train"]
    )  # every module, lazy imports counted
    found = cycles(graph)
    assert not found, "\n".join(
        " <-> ".join(c) + ": " + "; ".join(f"{m} imports {sorted(graph[m] & set(c))}" for m in c) for c in found
    )


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between layers."""
    out: dict[str, set[str]] = {}
    for name, targets in graph.items():
        out.setdefault(layer(name), set()).update(layer(t) for t in targets if layer(t) != layer(name))
    return out


def test_no_layer_imports_one_that_imports_it_back():
    """Drawn with each layer as one box, no arrow runs back up but those UPWARD names (none today: the MLflow
    sink's report went up to the launcher, the run folder's formats down into rundir/, the sweep's into sweepdir/)."""
    layers = package_graph(import_graph())
    assert {"report", "planner", "sweep", "engine", "rundir", "sweepdir"} <= set(layers)
    for (low, high), why in UPWARD.items():
        assert high in layers.get(low, set()), f"UPWARD names {low} -> {high} ({why}), which no longer exists"
        layers[low] = layers[low] - {high}
    found = cycles(layers)
    assert not found, "\n".join(
        " <-> ".join(c) + ": " + "; ".join(f"{m} imports {sorted(layers[m] & set(c))}" for m in c) for c in found
    )


def test_each_layer_imports_only_what_the_table_allows():
    """A new edge between layers (or a new top-level module) is written into ALLOWED, with the review that goes
    with it; an edge the code no longer has is taken out, so the table stays what the code does."""
    layers = package_graph(import_graph())
    unplaced = sorted(set(layers) - set(ALLOWED))
    assert not unplaced, f"give each a line in ALLOWED (what it may import): {unplaced}"
    breaches = {name: sorted(targets - ALLOWED[name]) for name, targets in layers.items() if targets - ALLOWED[name]}
    assert not breaches, f"imports ALLOWED does not name (a layer reaching where it should not?): {breaches}"
    stale = {name: sorted(ALLOWED[name] - layers.get(name, set())) for name in ALLOWED
             if ALLOWED[name] - layers.get(name, set())}  # fmt: skip
    assert not stale, f"ALLOWED names edges the code no longer has (take them out): {stale}"


def test_the_planner_and_the_sweep_stay_torch_free_and_below_the_launcher():
    """The planner is arithmetic and file formats (the all-reduce harness that starts ranks is
    launch/allreduce.py); the sweep starts processes and never imports the engine it times (engine/probe.py); the
    report reads the sweep's formats, never its executors."""
    assert not closure("planner") & {"launch", "engine", "distributed", "compat", "models", "kernels"}
    assert not ALLOWED["sweep"] & {"engine", "kernels", "models", "distributed"}  # the launcher starts those
    assert not closure("report") & {"engine", "launch", "sweep"}
    every = [m for m in module_names() if m not in ("ddplab", *USE_TORCH) and layer(m) in TORCH_FREE]
    probe = "import sys; sys.modules['torch'] = None\nimport importlib\n" + "".join(
        f"importlib.import_module({m!r})\n" for m in sorted(every)
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"a torch-free layer imported torch:\n{done.stderr[-2000:]}"


# The layers that start processes, read and write files and draw, and never need torch to be imported.
TORCH_FREE = ("errors", "io", "stops", "topology", "tracking", "config", "rundir", "planner", "sweepdir", "report",
              "sweep", "log", "faults")  # fmt: skip
USE_TORCH = ("ddplab.rundir.checkpoint",)  # torch's own file format: only what trains or resumes imports it


def closure(name: str) -> set[str]:
    """The layers `name` may reach, through the layers it may import."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        for below in ALLOWED[todo.pop()] - seen:
            seen.add(below)
            todo.append(below)
    return seen


# Imports each layer's modules in a child forked from one interpreter that has imported torch, numpy and the
# standard library's heavy modules already (what the children share is not ddplab's), and prints the ddplab
# modules each one loaded.
LOAD_PROBE = """
import json, os, sys
import numpy, torch  # noqa: F401  (not ddplab's: loaded once, before the forks)
layers = json.loads(sys.argv[1])
found = {}
for name, modules in layers.items():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        import importlib
        for m in modules:
            importlib.import_module(m)
        os.write(w, json.dumps(sorted(m for m in sys.modules if m.startswith("ddplab."))).encode())
        os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 1 << 16):
        chunks.append(chunk)
    os.close(r)
    status = os.waitpid(pid, 0)[1]
    found[name] = json.loads(b"".join(chunks)) if os.waitstatus_to_exitcode(status) == 0 else None
print(json.dumps(found))
"""


def test_each_layer_loads_only_what_it_may_import():
    """What a layer loads when imported, not only what its import statements name: a module-level call into
    another module, a re-export, a lazy import run at import time all count. The sweep's formats, read by the
    report and the planner, load no executor, no process tree and no warm server."""
    by_layer: dict[str, list[str]] = {}
    for name in module_names():
        if name not in ("ddplab", "ddplab.__main__"):  # __main__ runs the CLI when imported
            by_layer.setdefault(layer(name), []).append(name)
    done = subprocess.run(
        [sys.executable, "-c", LOAD_PROBE, json.dumps(by_layer)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout)
    failed = sorted(name for name, modules in loaded.items() if modules is None)
    assert not failed, f"these layers' modules did not import on their own: {failed}"
    beyond = {
        name: sorted({layer(m) for m in modules} - closure(name) - {name})
        for name, modules in loaded.items()
        if {layer(m) for m in modules} - closure(name) - {name}
    }
    assert not beyond, f"layers that load more than ALLOWED lets them reach: {beyond}"
    assert not {layer(m) for m in loaded["sweepdir"]} & {"sweep", "launch", "report"}
