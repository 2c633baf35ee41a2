"""`ddplab sweep` for real: runs in their own process trees, failures recorded, re-runs resume, a report at the end."""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from ddplab.topology import usable_cores

from support.cli import ddplab_cli
from support.readers import metrics
from support.sweeps import TINY_BASE, tiny_sweep

TINY = (
    TINY_BASE
    + """
[[variants]]
label = "single"
"dist.strategy" = "single"
"train.batch_size" = 32

[[variants]]
label = "ddp x2"
"dist.strategy" = "ddp"
"dist.nproc" = 2

[[variants]]
label = "broken"
"model.batchnorm" = true
"model.fuse_conv_relu" = true
"""
)


def ddplab(*args, env=None, cwd=None):
    return ddplab_cli(*args, env=env, cwd=cwd, timeout=600)


def manifest(out):
    return {r["name"]: r for r in json.loads((out / "manifest.json").read_text())["runs"]}


@pytest.fixture(scope="module")
def sweep_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("sweep") / "tiny.toml"
    path.write_text(TINY)
    return path


def test_dry_run_lists_the_runs_and_runs_nothing(sweep_file, tmp_path):
    proc = ddplab("sweep", str(sweep_file), "--out", str(tmp_path / "s"), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"sweep tiny: 3 runs in {tmp_path / 's'}"
    assert [line.split()[0] for line in proc.stdout.splitlines()[1:]] == ["single", "ddp-x2", "broken"]
    assert not (tmp_path / "s").exists()


def test_a_sweep_survives_failures_and_a_rerun_resumes(sweep_file, tmp_path):
    out = tmp_path / "s"
    # 1. Every run dies in epoch 2 (after epoch 1's checkpoint); the broken one cannot start at all.
    proc = ddplab(
        "sweep", str(sweep_file), "--out", str(out), "--no-report", env={"DDPLAB_FAULT": "raise:rank=0:epoch=2:step=1"}
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"ddplab: error: 3 of 3 runs did not finish (see {out / 'manifest.json'}); run the sweep again to retry them"
    )
    runs = manifest(out)
    assert [runs[n]["status"] for n in ("single", "ddp-x2", "broken")] == ["failed", "failed", "failed"]
    assert runs["single"]["exit_code"] == 4 and "injected fault" in runs["single"]["error"]
    assert runs["ddp-x2"]["exit_code"] == 4 and runs["ddp-x2"]["error"].startswith("worker rank 0 failed")
    assert runs["broken"]["exit_code"] == 2 and "no Conv2d->ReLU pair" in runs["broken"]["error"]
    assert runs["ddp-x2"]["point"] == {"variant": "ddp x2"} and runs["ddp-x2"]["seed"] == 0
    # Before the first run, how long the sweep will take, each point probed; after the last, how that went.
    assert re.search(
        r"^sweep tiny: expected to take about [\d.]+ s: each point probed in [\d.]+ s; a run of single "
        r"[\d.]+ s, ddp x2 [\d.]+ s, broken [\d.]+ s$",
        proc.stdout,
        re.M,
    ), proc.stdout
    assert re.search(
        r"^sweep tiny: 3 runs in [\d.]+ s; expected [\d.]+ s before the first \([+-]\d+%\)$", proc.stdout, re.M
    )
    # 2. Again, without the fault: the two interrupted runs resume from their checkpoints; the broken one fails again.
    proc = ddplab("sweep", str(sweep_file), "--out", str(out), "--no-report", "--no-estimate")
    assert proc.returncode == 1 and "1 of 3 runs did not finish" in proc.stderr.strip().splitlines()[-1]
    assert "[1/3] single: resuming" in proc.stdout and "[2/3] ddp-x2: resuming" in proc.stdout
    assert "expected" not in proc.stdout
    runs = manifest(out)
    assert [runs[n]["status"] for n in ("single", "ddp-x2", "broken")] == ["finished", "finished", "failed"]
    # what the estimate prices a finished point by: the wall of the last process, and the epochs it trained
    assert runs["single"]["wall_epochs"] == runs["ddp-x2"]["wall_epochs"] == 1
    # A resumed run is the run it would have been: the same as one never interrupted.
    for name in ("single", "ddp-x2"):
        fresh = tmp_path / f"fresh-{name}"
        assert ddplab("train", "--config", str(out / "configs" / f"{name}.toml"), "--out", str(fresh)).returncode == 0
        assert metrics(out / "runs" / name) == metrics(fresh), name
    # 3. Once more: finished runs are not touched.
    before = (out / "runs" / "single" / "summary.json").stat().st_mtime_ns
    proc = ddplab("sweep", str(sweep_file), "--out", str(out), "--no-estimate")
    assert "2 already finished, 1 to run" in proc.stdout
    assert (out / "runs" / "single" / "summary.json").stat().st_mtime_ns == before
    # ... and the report is made from the sweep folder at the end.
    assert (out / "report" / "index.html").is_file() and "report:" in proc.stdout
    # ... and the finished runs are sessions of TensorBoard's HParams view (the failed one is not).
    assert sorted(p.name for p in (out / "tensorboard").iterdir()) == ["ddp-x2", "single"]
    assert f"tensorboard --logdir {out / 'tensorboard'}" in proc.stdout


def test_ctrl_c_stops_the_sweep_and_its_run_which_resumes_later(tmp_path):
    import signal
    import time

    path = tmp_path / "long.toml"
    path.write_text(
        TINY.replace("epochs = 2", "epochs = 200").replace(
            """[[variants]]
label = "broken"
"model.batchnorm" = true
"model.fuse_conv_relu" = true
""",
            "",
        )
    )
    out = tmp_path / "s"
    # SIGINT as a terminal delivers it, also when the suite itself runs in the background (`cmd &`), where the
    # shell hands every child SIGINT ignored and Python keeps it so.
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddplab", "sweep", str(path), "--out", str(out), "--no-report", "--no-estimate"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    metrics_file = out / "runs" / "single" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics_file.exists() and metrics_file.read_text().strip()):  # the first run is training
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C at the terminal reaches the sweep, not its run's own session
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == "ddplab: interrupted" and "Traceback" not in err
    runs = manifest(out)
    assert runs["single"]["status"] == "interrupted" and runs["single"]["exit_code"] == 130
    assert runs["ddp-x2"]["status"] == "pending"  # never started
    assert (out / "runs" / "single" / "checkpoints" / "last.pt").is_file()
    proc = ddplab("sweep", str(path), "--out", str(out), "--dry-run")
    assert "single" in proc.stdout and "resume" in proc.stdout.splitlines()[1]


@pytest.mark.parametrize("how", ["terminal", "kill"])
def test_ctrl_c_after_the_sweep_measured_its_all_reduce_in_process_is_still_one_line_and_130(tmp_path, how):
    """The sweep times its DDP points' all-reduce through torch's elastic launcher in its own process before any
    point; the launcher's agent had left its signal handlers there, and Ctrl-C to the first point raised its
    SignalException from the sweep's wait: a traceback, exit 1, the manifest left "running". SIGINT as a terminal
    sends it (to the process group) and as a script's `kill -INT` sends it (to the sweep alone)."""
    import signal
    import uuid

    path, out, marker = tiny_sweep(tmp_path / "measured.toml"), tmp_path / "s", f"DDPLAB_TEST_{uuid.uuid4().hex}"
    proc = start_sweep(path, out, marker, report=True)
    wait_for_epochs(proc, out / "runs" / "a" / "metrics.jsonl")  # held in its second epoch
    assert (out / "links.json").is_file()  # measured before the first point
    (os.killpg if how == "terminal" else os.kill)(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == "ddplab: interrupted" and "Traceback" not in err, err[-3000:]
    runs = manifest(out)
    assert (runs["a"]["status"], runs["a"]["exit_code"]) == ("interrupted", 130)
    assert runs["b"]["status"] == runs["ddp"]["status"] == "pending"


def long_sweep(tmp_path, epochs=200):
    """TINY's single-process run alone (named "single"), long enough to be stopped while it trains."""
    path = tmp_path / "long.toml"
    path.write_text(
        TINY_BASE.replace("epochs = 2", f"epochs = {epochs}")
        + '[[variants]]\nlabel = "single"\n"dist.strategy" = "single"\n'
    )
    return path


HELD = {"DDPLAB_FAULT": "hang:epoch=2"}  # a run stays in its second epoch until it is stopped: the fault hook as timer


def start_sweep(path, out, marker, *args, sigint=None, env=HELD, report=False):
    """`sigint`: the disposition the sweep starts with (default: Python's; SIG_IGN: as a script's `cmd &`); `env`
    over this process's, given to every run (default: each is held in its second epoch); `report`: as the
    command's default (its DDP points' all-reduce measured first, in-process), else --no-report."""
    import signal

    return subprocess.Popen(
        [sys.executable, "-m", "ddplab", "sweep", str(path), "--out", str(out), "--no-estimate", *args]
        + ([] if report else ["--no-report"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", marker: "1", **env},
        preexec_fn=lambda: signal.signal(signal.SIGINT, sigint or signal.SIG_DFL),
    )


def wait_for_epochs(proc, metrics_file, count=1):
    import time

    deadline = time.monotonic() + 120
    while not (metrics_file.exists() and metrics_file.read_text().count("\n") >= count):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.1)


@pytest.mark.parametrize("how", ["SIGTERM", "SIGHUP", "SIGKILL"])
def test_a_killed_sweep_leaves_no_run_training_and_a_rerun_finishes_it(tmp_path, how):
    """SIGTERM or SIGHUP (a closed terminal) at the sweep stops it as Ctrl-C does (130, one line naming the
    signal, the manifest saying "interrupted"); SIGKILL leaves the kernel to stop its run (PR_SET_PDEATHSIG).
    Either way no process trains on unsupervised, the run stays resumable, and a re-run finishes it without
    truncating its log or marking it failed. The stopped sweep starts with SIGINT ignored (as a script's
    `cmd &` does) and still stops its run as Ctrl-C does: the run's own line says so."""
    import signal
    import time
    import uuid

    from support.readers import leftover_processes

    path, out, marker = long_sweep(tmp_path, epochs=3), tmp_path / "s", f"DDPLAB_TEST_{uuid.uuid4().hex}"
    proc = start_sweep(path, out, marker, sigint=signal.SIG_IGN if how != "SIGKILL" else None)
    wait_for_epochs(proc, out / "runs" / "single" / "metrics.jsonl")
    os.kill(proc.pid, getattr(signal, how))
    _, err = proc.communicate(timeout=120)
    if how != "SIGKILL":
        assert "interrupted by SIGINT" in (out / "logs" / "single.log").read_text()
        assert proc.returncode == 130 and err.strip().splitlines()[-1] == f"ddplab: interrupted by {how}", err[-3000:]
        assert manifest(out)["single"]["status"] == "interrupted"
    else:
        assert proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 60
    while leftover_processes(marker):  # the run stops itself (held in epoch 2, it would never end on its own)
        assert time.monotonic() < deadline, leftover_processes(marker)
        time.sleep(0.1)
    assert not (out / "runs" / "single" / "summary.json").exists()
    assert (out / "runs" / "single" / "checkpoints" / "last.pt").is_file()
    rerun = ddplab("sweep", str(path), "--out", str(out), "--no-report", "--no-estimate", env={marker: "1"})
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert manifest(out)["single"]["status"] == "finished"
    assert "resuming" in rerun.stdout
    log = (out / "logs" / "single.log").read_text()
    assert "\0" not in log and log.count("\n$ ") == 2  # both attempts, whole
    assert len(metrics(out / "runs" / "single")) == 3  # the re-run is not held: it resumes and finishes
    assert leftover_processes(marker) == []


def test_a_rerun_waits_for_a_live_owner_of_a_run_folder(tmp_path):
    """A run folder still held by a live process (a killed sweep's run, stopping) is waited for, never run
    beside: the re-run says whom it waits for, and goes on once the folder is free."""
    import uuid

    path, out = long_sweep(tmp_path, epochs=1), tmp_path / "s"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from ddplab.rundir.runlock import run_lock\n"
            f"with run_lock(__import__('pathlib').Path({str(out / 'runs' / 'single')!r})):\n"
            "    print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    rerun = subprocess.Popen(
        [sys.executable, "-m", "ddplab", "sweep", str(path), "--out", str(out), "--no-report", "--no-estimate"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", f"DDPLAB_TEST_{uuid.uuid4().hex}": "1"},
    )
    lines = []
    for line in rerun.stdout:
        lines.append(line)
        if "waiting for" in line:
            break
    assert f"pid {holder.pid}" in lines[-1], lines
    holder.stdin.close()  # the owner lets go
    assert holder.wait(60) == 0
    rest, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err[-3000:]
    assert manifest(out)["single"]["status"] == "finished"


def parallel_sweep(tmp_path, epochs=2):
    return tiny_sweep(tmp_path / "parallel.toml", epochs=epochs)


needs_two_cores = pytest.mark.skipif(len(usable_cores()) < 2, reason="two slots need two CPU cores")


@needs_two_cores
@pytest.mark.alone(why="measures: another test beside it is other load")
def test_a_parallel_sweep_runs_points_at_once_each_on_its_own_cores_and_measures_what_one_at_a_time_does(tmp_path):
    path = parallel_sweep(tmp_path)
    one = ddplab("sweep", str(path), "--out", str(tmp_path / "one"), "--no-report", "--no-estimate")
    assert one.returncode == 0, one.stderr[-3000:]
    # Tracked in MLflow where it is installed: two points at once write one SQLite store.
    tracked = importlib.util.find_spec("mlflow") is not None
    store = ["--output.mlflow", "sqlite:///store/mlflow.db"] if tracked else []
    two = ddplab("sweep", str(path), "--out", "two", "--parallel", "2", "--no-estimate", *store, cwd=tmp_path)
    assert two.returncode == 0, two.stderr[-3000:]
    lines = [line for line in two.stdout.splitlines() if line.startswith(("sweep tiny: 3 runs", "[", "  sweep:"))]
    cores = len(usable_cores()) // 2
    assert re.search(rf"up to 2 points at once, {cores}(-{cores + 1})? CPU cores?", lines[0]), lines[0]

    def first(start):
        return next(i for i, line in enumerate(lines) if line.startswith(start))

    assert first("[2/3] b: running") < first("[1/3] a: finished")  # both trained at once
    assert {r["status"] for r in manifest(tmp_path / "two").values()} == {"finished"}
    for name, workers in (("a", 1), ("b", 1), ("ddp", 2)):
        assert metrics(tmp_path / "two" / "runs" / name) == metrics(tmp_path / "one" / "runs" / name), name
        env = json.loads((tmp_path / "two" / "runs" / name / "env.json").read_text())
        assert env["cpu_cores"] in (cores, cores + 1) and env["torch_threads"] == max(1, env["cpu_cores"] // workers)
    assert (tmp_path / "two" / "report" / "index.html").is_file()
    # A sweep with multi-worker runs that writes a report measures the link its predictions use; --no-report does not.
    assert "measuring this machine's all-reduce (gloo x2)" in two.stdout and (tmp_path / "two" / "links.json").is_file()
    assert not (tmp_path / "one" / "links.json").exists()
    if tracked:
        from support.mlflow_store import assert_sweep_tracked

        assert_sweep_tracked(f"sqlite:///{tmp_path}/store/mlflow.db", tmp_path / "two", epochs=2)


@needs_two_cores
def test_sigterm_stops_every_running_point_of_a_parallel_sweep_and_a_rerun_finishes_them(tmp_path):
    """SIGTERM at the sweep alone (a scheduler's, a script's `kill`), started as a script's `cmd &` starts it
    (SIGINT ignored): each running point is stopped resumable, as Ctrl-C at a serial sweep stops its run. More
    SIGTERMs while it stops are ignored."""
    import contextlib
    import signal
    import time
    import uuid

    from support.readers import leftover_processes

    # Held in epoch 2 until SIGTERM comes (it comes once each has one epoch); the re-run, not held, finishes them
    path, out, marker = parallel_sweep(tmp_path, epochs=3), tmp_path / "s", f"DDPLAB_TEST_{uuid.uuid4().hex}"
    proc = start_sweep(path, out, marker, "--parallel", "2", sigint=signal.SIG_IGN)
    for name in ("a", "b"):
        wait_for_epochs(proc, out / "runs" / name / "metrics.jsonl")
    os.kill(proc.pid, signal.SIGTERM)
    # ... and a second SIGTERM, meant to be ignored, in every phase of the stop (the points stopping, the manifest
    # written, the last line said, the process ending): the exit code stays 130, never SIGTERM's 143.
    while proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        time.sleep(0.01)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "ddplab: interrupted by SIGTERM", err[-3000:]
    runs = manifest(out)
    assert [(runs[n]["status"], runs[n]["exit_code"]) for n in ("a", "b")] == [("interrupted", 130)] * 2
    assert runs["ddp"]["status"] == "pending"
    deadline = time.monotonic() + 60
    while leftover_processes(marker):
        assert time.monotonic() < deadline, leftover_processes(marker)
        time.sleep(0.1)
    rerun = ddplab(
        "sweep", str(path), "--out", str(out), "--no-report", "--no-estimate", "--parallel", "2", env={marker: "1"}
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert {r["status"] for r in manifest(out).values()} == {"finished"}
    assert rerun.stdout.count("resuming") == 2
    assert all(len(metrics(out / "runs" / n)) == 3 for n in ("a", "b", "ddp"))
    assert leftover_processes(marker) == []


class Recording:
    """A sweep tracker (sweep/trackers.py) that records what it is told."""

    def __init__(self, sweep, folder, told):
        self.told = told

    def start(self, name, params):
        self.told.append(("start", name, params["points"], params["axes"]))

    def end(self, paths, finished):
        self.told.append(("end", [p.name for p in paths], finished))

    def stopped(self, error):
        self.told.append(("stopped", type(error).__name__))


def test_a_sweep_runs_from_python_as_the_command_runs_it(tmp_path, monkeypatch):
    """`ddplab.run_sweep`: the points run in processes of their own, the report is written, the result says where
    and how each point ended, a sweep tracker (a line in sweep/trackers.TRACKERS) is told its start and end;
    called again it resumes (nothing finished is run twice); a bad setting is one error before anything is
    written."""
    from ddplab import run_sweep
    from ddplab.errors import ConfigError
    from ddplab.sweep import LocalExecutor, trackers

    told: list = []
    monkeypatch.setattr(trackers, "TRACKERS", (*trackers.TRACKERS, lambda s, f: Recording(s, f, told)))
    path, out, said = tiny_sweep(tmp_path / "tiny.toml", variants=""), tmp_path / "s", []
    path.write_text(path.read_text() + '[grid]\n"optim.lr" = [0.01, 0.02]\n')
    result = run_sweep(path, out=out, overrides=["train.epochs=1"], executor=LocalExecutor(), echo=said.append)
    assert told == [("start", "sweep tiny", "2", "optim.lr"), ("end", ["report", "manifest.json"], True)]
    assert result.folder == out and result.unfinished == [] and not result.queued
    assert [e.status.value for e in result.manifest.runs] == ["finished", "finished"]
    assert result.report == out / "report" and (out / "report" / "index.html").is_file()
    assert any(line.startswith("report: ") for line in said) and "2 runs (2 finished), 1 section(s):" in said
    assert [len(metrics(out / e.dir)) for e in result.manifest.runs] == [1, 1]  # train.epochs=1 reached each point
    before = (out / result.manifest.runs[0].dir / "summary.json").stat().st_mtime_ns
    again = run_sweep(path, out=out, overrides=["train.epochs=1"], executor="local", report=False, echo=said.append)
    assert again.unfinished == [] and again.report is None and any("2 already finished" in s for s in said)
    assert (out / result.manifest.runs[0].dir / "summary.json").stat().st_mtime_ns == before
    with pytest.raises(ConfigError, match="train.epochz"):
        run_sweep(path, out=tmp_path / "other", overrides=["train.epochz=1"])
    assert not (tmp_path / "other").exists()
