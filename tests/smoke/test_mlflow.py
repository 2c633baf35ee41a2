"""MLflow for real: runs logged to a SQLite store and to an `mlflow server` on loopback, read back through
MlflowClient (params, metric histories, artifacts, parent and child runs); a resumed run continues its
MLflow run; a server that is down, or goes away mid-run, costs the run nothing and its summary says so. A sweep
as a parent run with a child per point: tests/smoke/test_sweep_runs.py's parallel sweep, tracked."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from ddplab import tracking
from ddplab.metrics import sinks
from ddplab.metrics.mlflow_sink import flat
from ddplab.rundir.epochs import read_epochs

from support import tiers
from support.mlflow_store import artifacts, history, runs_of
from support.settings import tiny_config

pytestmark = pytest.mark.slow(why="a tracking server and the runs that log to it, each a process")
mlflow = tiers.importorskip("mlflow", "mlflow", "MLflow comes with the mlflow extra (scripts/test.sh installs it)")


@pytest.fixture(autouse=True)
def no_tracking_from_the_shell(monkeypatch):
    for name in (tracking.URI_ENV, tracking.EXPERIMENT_ENV, tracking.POINT_ENV):
        monkeypatch.delenv(name, raising=False)


def train(config):
    from ddplab import train as ddplab_train

    return ddplab_train(config)


def test_a_run_logs_its_config_epochs_and_files_to_a_sqlite_store(tmp_path):
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    config = tiny_config(tmp_path / "run", output={"mlflow": uri})
    result = train(config)
    run_id = json.loads((tmp_path / "run" / "mlflow.json").read_text())["run_id"]
    assert result.summary["tracking"] == {"mlflow": {"uri": uri, "run_id": run_id, "logged": True, "error": None}}
    (run,) = runs_of(uri)
    assert run.info.run_id == run_id and run.info.status == "FINISHED" and run.info.run_name == "run"
    assert run.data.params == flat(config.to_dict())
    records = read_epochs(tmp_path / "run" / "metrics.jsonl")
    assert history(uri, run_id, "test_acc") == [(r.epoch, r.test_acc) for r in records]
    assert history(uri, run_id, "train_loss") == [(r.epoch, pytest.approx(r.train_loss)) for r in records]
    assert [step for step, _ in history(uri, run_id, "system/load_avg_1m")] == [1, 2]
    tags = run.data.tags
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert tags["ddplab.version"] == env["ddplab"] and tags["ddplab.torch"] == env["torch"]
    assert tags["ddplab.world_size"] == "1" and tags["ddplab.strategy"] == "single"
    assert tags.get("mlflow.source.git.commit") == env["git_sha"]  # absent where the code is not a checkout
    assert artifacts(uri, run_id) == ["config.toml", "report", "summary.json"]
    assert "report/index.html" in artifacts(uri, run_id, "report")
    assert any(p.endswith(".png") for p in artifacts(uri, run_id, "report/plots"))
    # A SQLite store keeps its artifacts beside the database, whatever the working directory was.
    assert (tmp_path / "store" / "mlflow-artifacts").is_dir()


def test_a_resumed_run_continues_its_mlflow_run(tmp_path, monkeypatch):
    from ddplab import faults
    from ddplab.errors import TrainingError

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    config = tiny_config(tmp_path / "run", train={"epochs": 3}, output={"mlflow": uri})
    monkeypatch.setattr(faults, "_FAULT", faults.parse("raise:epoch=2:step=1"))  # this process's, read once
    with pytest.raises(TrainingError):
        train(config)
    (failed,) = runs_of(uri)
    assert failed.info.status == "FAILED"
    assert history(uri, failed.info.run_id, "test_acc")[0][0] == 1
    monkeypatch.setattr(faults, "_FAULT", None)
    resumed = tiny_config(tmp_path / "run", train={"epochs": 3}, output={"mlflow": uri, "resume": True})
    train(resumed)
    (run,) = runs_of(uri)  # the same run, not a second
    assert run.info.run_id == failed.info.run_id and run.info.status == "FINISHED"
    assert [step for step, _ in history(uri, run.info.run_id, "test_acc")] == [1, 2, 3]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`mlflow server` on loopback, its own process group; up once /health answers."""

    def __init__(self, tmp_path):
        self.port = free_port()
        self.store = f"sqlite:///{tmp_path}/server.db"
        self.log = open(tmp_path / "server.log", "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", self.store, "--artifacts-destination",
             str(tmp_path / "server-artifacts"), "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        )  # fmt: skip
        self.uri = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while not self.healthy():
            assert self.process.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "mlflow server did not answer /health within 120 s"
            time.sleep(0.2)

    def healthy(self):
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        self.log.close()


def test_a_server_that_goes_away_mid_run_costs_the_run_nothing(tmp_path, monkeypatch):
    server = Server(tmp_path)
    try:

        class StopsTheServer(sinks.NullSink):  # after the MLflow sink has logged epoch 1
            def epoch_end(self, record):
                if record.epoch == 1:
                    server.stop()

        monkeypatch.setattr(sinks, "SINKS", (*sinks.SINKS, lambda config, run_dir, history: StopsTheServer()))
        result = train(tiny_config(tmp_path / "run", train={"epochs": 3}, output={"mlflow": server.uri}))
    finally:
        server.stop()
    assert result.summary["status"] == "finished" and result.summary["run"]["epochs_done"] == 3
    state = result.summary["tracking"]["mlflow"]
    assert state["logged"] is False and state["error"].startswith("logging: ")
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert on_disk["tracking"] == result.summary["tracking"]
    log = (tmp_path / "run" / "train.log").read_text()
    assert log.count(f"MLflow at {server.uri} failed") == 1, log  # warned about once
    # What reached the server before it went: epoch 1, the run still marked running.
    (run,) = runs_of(server.store)
    assert run.info.run_id == state["run_id"] and run.info.status == "RUNNING"
    assert [step for step, _ in history(server.store, run.info.run_id, "test_acc")] == [1]
    assert "train.epochs" in run.data.params


def test_a_server_down_from_the_start_costs_the_run_nothing(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens
    started = time.monotonic()
    result = train(tiny_config(tmp_path / "run", output={"mlflow": uri}))
    assert time.monotonic() - started < 60  # one refused connection, not MLflow's retries with backoff
    assert result.summary["status"] == "finished"
    state = result.summary["tracking"]["mlflow"]
    assert state["logged"] is False and state["run_id"] is None
    assert state["error"].startswith("opening experiment 'ddplab': ")
    assert not (tmp_path / "run" / "mlflow.json").exists()
