"""`ddplab sweep` for real: runs in their own process trees, failures recorded, re-runs resume, a report at the end."""

import json
import os
import subprocess
import sys

import pytest

from ddplab.metrics.records import is_machine_field

TINY = """
[sweep]
name = "tiny"

[base.data]
dataset = "synthetic"
synthetic_size = 256
image_size = 16
num_classes = 4
crop_padding = 0
flip = false

[base.model]
width = 0.5
dropout = 0.0

[base.train]
epochs = 2
batch_size = 16
device = "cpu"

[base.output]
tensorboard = false

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


def ddplab(*args, env=None):
    return subprocess.run([sys.executable, "-m", "ddplab", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def metrics(run_dir):
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not is_machine_field(k) and not k.startswith("rank_")} for r in records]


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
    proc = ddplab("sweep", str(sweep_file), "--out", str(out), "--no-report", env={"DDPLAB_FAULT": "raise:rank=0:epoch=2:step=1"})
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"ddplab: error: 3 of 3 runs did not finish (see {out / 'manifest.json'}); run the sweep again to retry them")
    runs = manifest(out)
    assert [runs[n]["status"] for n in ("single", "ddp-x2", "broken")] == ["failed", "failed", "failed"]
    assert runs["single"]["exit_code"] == 4 and "injected fault" in runs["single"]["error"]
    assert runs["ddp-x2"]["exit_code"] == 4 and runs["ddp-x2"]["error"].startswith("worker rank 0 failed")
    assert runs["broken"]["exit_code"] == 2 and "no Conv2d->ReLU pair" in runs["broken"]["error"]
    assert runs["ddp-x2"]["point"] == {"variant": "ddp x2"} and runs["ddp-x2"]["seed"] == 0
    # 2. Again, without the fault: the two interrupted runs resume from their checkpoints; the broken one fails again.
    proc = ddplab("sweep", str(sweep_file), "--out", str(out), "--no-report")
    assert proc.returncode == 1 and "1 of 3 runs did not finish" in proc.stderr.strip().splitlines()[-1]
    assert "[1/3] single: resuming" in proc.stdout and "[2/3] ddp-x2: resuming" in proc.stdout
    runs = manifest(out)
    assert [runs[n]["status"] for n in ("single", "ddp-x2", "broken")] == ["finished", "finished", "failed"]
    # A resumed run is the run it would have been: the same as one never interrupted.
    for name in ("single", "ddp-x2"):
        fresh = tmp_path / f"fresh-{name}"
        assert ddplab("train", "--config", str(out / "configs" / f"{name}.toml"), "--out", str(fresh)).returncode == 0
        assert metrics(out / "runs" / name) == metrics(fresh), name
    # 3. Once more: finished runs are not touched.
    before = (out / "runs" / "single" / "summary.json").stat().st_mtime_ns
    proc = ddplab("sweep", str(sweep_file), "--out", str(out))
    assert "2 already finished, 1 to run" in proc.stdout
    assert (out / "runs" / "single" / "summary.json").stat().st_mtime_ns == before
    # ... and the report is made from the sweep folder at the end.
    assert (out / "report" / "index.html").is_file() and "report:" in proc.stdout


def test_ctrl_c_stops_the_sweep_and_its_run_which_resumes_later(tmp_path):
    import signal
    import time

    path = tmp_path / "long.toml"
    path.write_text(TINY.replace("epochs = 2", "epochs = 200").replace('''[[variants]]
label = "broken"
"model.batchnorm" = true
"model.fuse_conv_relu" = true
''', ""))
    out = tmp_path / "s"
    # SIGINT as a terminal delivers it, also when the suite itself runs in the background (`cmd &`), where the
    # shell hands every child SIGINT ignored and Python keeps it so.
    proc = subprocess.Popen([sys.executable, "-m", "ddplab", "sweep", str(path), "--out", str(out), "--no-report"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
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
