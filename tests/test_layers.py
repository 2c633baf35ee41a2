"""Imports run one way, and only along the edges written down here.

No module of ddplab imports, at any depth, inside a function or for type checkers only, one that imports it back;
no package imports one that imports it back; and each package (engine, sweep, report, planner, ...) and each
top-level module imports only what ALLOWED names for it: a new edge is a decision, made here, where a reviewer
sees it (in the spirit of torchtitan's frozen-API tests). A cycle is where a layer reaches up (the public
train() once lived in the worker body and called up into the launcher; the planner read runs through the
report). The package's root (`ddplab/__init__.py`, the lazy public facade) is left out.
"""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# Each layer (a subpackage, or a module at the top level) -> the layers it may import. Read bottom up: errors,
# the file formats and the torch-free readers; then data, models, metrics, kernels and the engine (torch); the
# launcher and its harnesses; the planner (arithmetic and file formats: torch-free), the sweep (torch-free:
# it starts processes), the report; the CLI on top.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "internals": set(),  # the private APIs of CPython, torch and numpy: reached by any layer through it alone
    "rundir": set(),  # the folder packages' docstrings: their modules are layers of their own (OWN_LAYER)
    "io": set(),
    "log": set(),
    "seeding": set(),
    "stops": {"errors"},
    "borders": {"errors"},
    "files": {"errors"},
    "hosts": {"arguments", "errors"},
    "models": {"errors"},
    "runfiles": {"errors"},
    "topology": {"errors"},
    "arguments": {"borders"},
    "environment": {"borders", "errors"},
    "compat": {"errors", "internals", "stops"},
    "faults": {"errors", "topology"},
    "tracking": {"errors", "files"},
    "warm": {"compat", "environment", "internals"},
    "process": {"errors", "stops", "warm"},
    "watchdog": {"errors", "process", "warm"},
    "data": {"errors", "internals", "seeding"},
    "config": {"arguments", "data", "errors", "files", "topology", "tracking"},
    "runlock": {"borders", "errors", "files", "runfiles"},
    "checkpoint": {"borders", "errors", "faults", "files", "runfiles"},
    "runfolder": {"checkpoint", "config", "errors", "runfiles"},
    "runplan": {"config", "errors", "files", "runfiles", "runfolder", "runlock", "topology"},
    "distributed": {"arguments", "compat", "config", "errors", "internals", "topology"},
    "metrics": {
        "arguments",
        "borders",
        "config",
        "distributed",
        "errors",
        "files",
        "process",
        "runfiles",
        "topology",
        "tracking",
    },  # fmt: skip
    "runread": {"borders", "config", "errors", "metrics", "runfiles"},
    "kernels": {"files", "metrics", "models"},
    "engine": {
        "checkpoint",
        "compat",
        "config",
        "data",
        "distributed",
        "errors",
        "faults",
        "files",
        "kernels",
        "log",
        "metrics",
        "models",
        "runfiles",
        "runfolder",
        "runplan",
        "seeding",
    },  # fmt: skip
    "launch": {
        "arguments",
        "borders",
        "compat",
        "config",
        "distributed",
        "engine",
        "errors",
        "internals",
        "faults",
        "runplan",
        "stops",
        "topology",
        "warm",
        "watchdog",
    },  # fmt: skip
    "planner": {"borders", "errors", "files", "metrics", "runfiles", "runread", "topology"},
    "allreduce": {"compat", "distributed", "errors", "files", "launch", "metrics", "planner", "topology"},
    "sweep": {
        "allreduce",
        "arguments",
        "borders",
        "config",
        "environment",
        "errors",
        "files",
        "launch",
        "metrics",
        "planner",
        "process",
        "report",
        "runfiles",
        "runlock",
        "runread",
        "stops",
        "sweep.folder",
        "sweep.spec",
        "topology",
        "tracking",
        "warm",
    },  # fmt: skip
    # the sweep's file formats, which the report reads (OWN_LAYER)
    "sweep.spec": {"config", "errors", "files", "metrics"},
    "sweep.folder": {"borders", "errors", "files", "planner", "runfiles", "runfolder", "sweep.spec"},
    "report": {
        "config",
        "errors",
        "files",
        "metrics",
        "planner",
        "runfiles",
        "runlock",
        "runread",
        "sweep.folder",
        "sweep.spec",
        "topology",
    },  # fmt: skip
    "cli": {
        "allreduce",
        "arguments",
        "compat",
        "config",
        "data",
        "engine",
        "errors",
        "internals",
        "faults",
        "files",
        "hosts",
        "kernels",
        "launch",
        "models",
        "planner",
        "report",
        "runfiles",
        "runfolder",
        "runread",
        "stops",
        "sweep",
        "sweep.folder",
        "topology",
        "warm",
    },  # fmt: skip
    "__main__": {"cli", "errors"},
}


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


# Modules that are a layer of their own inside their package: the sweep's file formats (the sweep file, the sweep
# folder and its manifest), which the report reads, below the rest of the sweep (run.py writes the report).
# And the folder packages, whose modules each keep the layer they had at the top level: the run folder's (rundir/:
# the metrics read file names from runfiles, runread reads the metrics' records), the launcher's family (launch/:
# the metrics read the process tree and the hosts, the engine the topology, while elastic.py starts the engine)
# and the borders with files and programs (io/).
FOLDERS = {
    "rundir": ("runfiles", "runfolder", "runlock", "runread", "runplan", "checkpoint"),
    "launch": ("elastic", "warm", "process", "watchdog", "allreduce", "hosts"),
    "io": ("borders", "files", "arguments", "environment"),
}
WARM = ("client", "server", "fresh", "spawn", "protocol")  # warm starts' package: one layer, "warm"
OWN_LAYER = {
    "ddplab.sweep.spec": "ddplab.sweep.spec",
    "ddplab.sweep.folder": "ddplab.sweep.folder",
    **{f"ddplab.{folder}.{m}": f"ddplab.{m}" for folder, names in FOLDERS.items() for m in names},
    **{f"ddplab.launch.warm.{m}": "ddplab.warm" for m in WARM},
    "ddplab.launch.elastic": "ddplab.launch",  # the launcher keeps its name
}


def test_each_module_of_a_folder_package_has_its_layer():
    """A module added to rundir/, launch/ or io/ says which layer it is (FOLDERS), or it would join another's."""
    modules = module_names()
    for folder, names in FOLDERS.items():
        inside = {m.split(".")[2] for m in modules if m.startswith(f"ddplab.{folder}.")}
        assert inside == set(names), f"{folder}/: give each module its layer in FOLDERS ({sorted(inside ^ set(names))})"
    warm = {m.rsplit(".", 1)[1] for m in modules if m.startswith("ddplab.launch.warm.")}
    assert warm == set(WARM), f"launch/warm/: give each module its place in WARM ({sorted(warm ^ set(WARM))})"


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph between layers: each subpackage (engine, sweep, report, planner, ...) and each top-level module,
    and the modules of OWN_LAYER."""

    def layer(name: str) -> str:
        return OWN_LAYER.get(name) or ".".join(name.split(".")[:2])

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


def test_each_layer_imports_only_what_the_table_allows():
    """A new edge between layers (or a new top-level module) is written into ALLOWED, with the review that goes
    with it; an edge the code no longer has is taken out, so the table stays what the code does."""
    layers = {name.removeprefix("ddplab."): {t.removeprefix("ddplab.") for t in targets}
              for name, targets in package_graph(import_graph()).items()}  # fmt: skip
    unplaced = sorted(set(layers) - set(ALLOWED))
    assert not unplaced, f"give each a line in ALLOWED (what it may import): {unplaced}"
    breaches = {name: sorted(targets - ALLOWED[name]) for name, targets in layers.items() if targets - ALLOWED[name]}
    assert not breaches, f"imports ALLOWED does not name (a layer reaching where it should not?): {breaches}"
    stale = {name: sorted(ALLOWED[name] - layers.get(name, set())) for name in ALLOWED
             if ALLOWED[name] - layers.get(name, set())}  # fmt: skip
    assert not stale, f"ALLOWED names edges the code no longer has (take them out): {stale}"


def test_the_planner_and_the_sweep_stay_torch_free_and_below_the_launcher():
    """The planner is arithmetic and file formats (the all-reduce harness that starts ranks is allreduce.py,
    beside the launcher); the sweep starts processes and never imports the engine it times (engine/probe.py)."""
    assert not ALLOWED["planner"] & {"launch", "engine", "distributed", "compat", "allreduce"}
    assert not ALLOWED["sweep"] & {"engine", "kernels", "models", "data"}
    assert not ALLOWED["report"] & {"engine", "launch", "allreduce", "sweep"}  # the sweep's formats, not its runs


# Folders that still import each other, each with its reason (issue 63 takes them out one by one); drawn with each
# folder as one box, no other pair may appear.
MUTUAL_FOLDERS = {
    ("launch", "metrics"): "the MLflow sink starts `ddplab report` through process.py; allreduce records the machine",
    ("metrics", "rundir"): "summary.json's and metrics.jsonl's declarations still live in metrics/, read by runread",
    ("report", "sweep"): "the report reads the sweep's formats (spec, folder), and run_sweep writes the report",
}


def test_folders_import_each_other_only_where_named():
    graph: dict[str, set[str]] = {}
    for name, targets in import_graph().items():
        for target in targets:
            a, b = name.split(".")[1], target.split(".")[1]
            if a != b:
                graph.setdefault(a, set()).add(b)
    mutual = {tuple(sorted((a, b))) for a in graph for b in graph[a] if a in graph.get(b, set())}
    assert mutual == set(MUTUAL_FOLDERS), (
        f"new: {sorted(mutual - set(MUTUAL_FOLDERS))}; gone (take them out of MUTUAL_FOLDERS): "
        f"{sorted(set(MUTUAL_FOLDERS) - mutual)}"
    )


def test_reading_a_sweep_folder_loads_no_executor_and_no_launcher():
    """The report and the planner read the sweep's formats (spec.py, folder.py); importing them must not load the
    local executor, the process tree or the warm server (what a layer loads, not only what it imports by name)."""
    import subprocess
    import sys

    above = ("ddplab.sweep.local", "ddplab.launch", "ddplab.report")
    probe = (
        "import sys; import ddplab.sweep.folder, ddplab.sweep.spec; "
        f"print(sorted(m for m in sys.modules if m.startswith({above!r})))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert loaded.stdout.strip() == "[]", loaded.stdout
