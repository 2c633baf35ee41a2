import json
import os
import signal
import time
from pathlib import Path

import pytest

from support.readers import cifar10_root
from support.settings import REPO, tiny_config

# Whole folders that spawn processes or train real runs: slow by nature (`pytest -m "not slow"` skips them).
SLOW_PLACES = {
    "tests/distributed/": "several processes, each a Python that imports torch",
    "tests/smoke/": "a command run as a user runs it, in a process of its own",
    "tests/test_benchmarks.py": "a benchmark script run as a user runs it",
}
# Files whose tests measure this machine's speed or load: `alone` (scripts/test.sh runs them after the rest, one at
# a time). A test elsewhere that measures is marked itself (a link's rate between hosts, a benchmark whose check
# bounds a measured figure); a benchmark script whose test checks only the shape of its result runs with the rest.
MEASURING = {"tests/smoke/test_report_browser.py": "what a browser lays out in a page is timed"}
# The budget of an in-process test (the fast tier): CPU seconds its call may take on the thread that runs it (other
# load on the machine does not count, nor a library's pool threads spinning while they wait: a whole process's CPU
# time put two 1-second tests over 5 s in one run of the suite), past which it fails unless marked slow or alone,
# saying why (torchtitan keeps a budget so; a test that needs the time says so where it is written). Twice a few
# seconds: a busy sibling hyperthread stretches CPU time too (the slowest in-process tests, about 2 s alone here,
# took 5.3 and 5.5 s of their thread's CPU in CI while apt installed beside them).
BUDGET_CPU_S = 10.0


def pytest_collection_modifyitems(config, items):
    """The fast tier: `-m "not slow"` leaves what runs in-process in about a second or less. Every slow or alone
    test says why, `@pytest.mark.slow(why=...)`, or sits in a place above that does."""
    unsaid = []
    for item in items:
        place = str(Path(item.fspath).relative_to(REPO))
        for places, mark in ((SLOW_PLACES, pytest.mark.slow), (MEASURING, pytest.mark.alone)):
            why = next((why for where, why in places.items() if place.startswith(where)), None)
            if why:
                item.add_marker(mark(why=why))
        for mark in (*item.iter_markers("slow"), *item.iter_markers("alone")):
            if not mark.kwargs.get("why"):
                unsaid.append(f"{item.nodeid} ({mark.name})")
    if unsaid:
        raise pytest.UsageError("say why each of these is slow or alone, mark(why=...): " + ", ".join(unsaid))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """An in-process test over its CPU budget fails, naming its cost, unless it says why it needs the time."""
    start = time.thread_time()
    result = yield
    spent = time.thread_time() - start
    if spent > BUDGET_CPU_S and not (item.get_closest_marker("slow") or item.get_closest_marker("alone")):
        pytest.fail(
            f"{spent:.1f} s of CPU, over an in-process test's budget of {BUDGET_CPU_S:g} s: make it smaller, or mark "
            "it @pytest.mark.slow(why=...) saying why it needs the time"
        )
    return result


def pytest_configure(config):
    """Under pytest-xdist (-n N), share the cores: torch would give every worker one thread per core.

    On a 16-core CUDA machine, 8 workers x 16 threads made in-process CPU training crawl
    (a 15 s test passed 200 s).
    """
    # Started under nohup (SIGHUP ignored) or as a background job of a shell without job control (SIGINT and
    # SIGQUIT ignored), every process the suite starts would inherit those signals ignored, which ddplab rightly
    # leaves ignored (stops.started_ignored): the tests of the stop rule send them as a terminal would.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        if signal.getsignal(sig) is signal.SIG_IGN:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


PASSES = {"not slow and not alone": "in-process", "slow and not alone": "processes", "alone": "alone"}


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Where $DDPLAB_TEST_RECORD names a file (scripts/test.sh), this pass's outcomes are appended to it, its skips
    with their reasons: tests/support/tiers.py checks them against what this machine should run."""
    record = os.environ.get("DDPLAB_TEST_RECORD")
    if not record or hasattr(config, "workerinput"):  # an xdist worker: its controller records the pass
        return
    stats = terminalreporter.stats

    def reason(report) -> str:
        longrepr = report.longrepr
        text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        return text.removeprefix("Skipped: ")

    mark = config.option.markexpr or ""
    outcome = {
        "name": PASSES.get(mark, mark or "pytest"),
        "passed": len([r for r in stats.get("passed", []) if r.when == "call"]),
        "failed": len(stats.get("failed", [])),
        "errors": len(stats.get("error", [])),
        "skipped": [{"nodeid": r.nodeid, "reason": reason(r)} for r in stats.get("skipped", [])],
    }
    with open(record, "a") as f:
        f.write(json.dumps(outcome) + "\n")


@pytest.fixture
def cifar_root() -> Path:
    root = cifar10_root()
    if root is None:
        from support.tiers import skip

        skip("cifar10", "CIFAR-10 not found: set DDPLAB_DATA to a root holding cifar-10-batches-bin")
    return root


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """tiny_run(**sections): ddplab.train's result for tiny_config(**sections), trained once a test session (and
    xdist worker) for every test that asks for the same settings; its folder is result.run_dir.

    Read it only: a test that changes a run (resumes, edits, corrupts it) copies the folder first
    (shutil.copytree). At the session's end each folder must be as it was trained, file for file, or the
    session errors naming what changed, so no test can lean on another's edits."""
    import ddplab

    made: dict[str, object] = {}
    trained: dict[Path, dict[str, tuple[int, int]]] = {}

    def run(**sections):
        key = repr(tiny_config(**sections))  # the whole config: two spellings of one run are one run
        if key not in made:
            result = ddplab.train(tiny_config(tmp_path_factory.mktemp("tiny_run") / "r", **sections))
            made[key] = result
            trained[result.run_dir] = files_of(result.run_dir)
        return made[key]

    yield run
    changed = [f"{folder}: {sorted(set(before.items()) ^ set(files_of(folder).items()))}"
               for folder, before in trained.items() if files_of(folder) != before]  # fmt: skip
    assert not changed, "a shared tiny_run was changed by a test (copy it first):\n" + "\n".join(changed)


def files_of(folder: Path) -> dict[str, tuple[int, int]]:
    """Each file under `folder`: its size and modification time."""
    return {
        str(f.relative_to(folder)): (f.stat().st_size, f.stat().st_mtime_ns) for f in folder.rglob("*") if f.is_file()
    }


@pytest.fixture(scope="session")
def sweep_report(tmp_path_factory):
    """A report over a small sweep, built once for every test that reads it (tests/support/reports.py)."""
    from ddplab.report.build import build_report

    from support.reports import write_sweep

    root = tmp_path_factory.mktemp("report")
    sweep = write_sweep(root)
    return build_report([sweep], root / "out"), root
