"""MLflow tracking's rules that need no MLflow: where a run logs, what a missing MLflow says, what is
kept in files and passed to a sweep's points, what an epoch becomes (tests/smoke/test_mlflow.py logs
to a real store and server)."""

import json
import logging

import pytest

from ddplab import tracking
from ddplab.errors import ConfigError
from ddplab.metrics.mlflow_sink import epoch_metrics, flat

from support import tiers
from support.runs import epoch_record


def test_the_setting_wins_then_the_variable_and_off_is_off(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(tracking.URI_ENV, raising=False)
    assert tracking.tracking_uri(None) is None
    assert tracking.tracking_uri("http://h:5000") == "http://h:5000"
    monkeypatch.setenv(tracking.URI_ENV, "http://env:5000")
    assert tracking.tracking_uri(None) == "http://env:5000"
    assert tracking.tracking_uri("http://h:5000") == "http://h:5000"
    assert tracking.tracking_uri("off") is None
    monkeypatch.setenv(tracking.URI_ENV, "off")
    assert tracking.tracking_uri(None) is None


def test_a_sqlite_store_is_made_absolute_once(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert tracking.absolute("sqlite:///runs/m.db") == f"sqlite:///{tmp_path}/runs/m.db"
    assert tracking.absolute(f"sqlite:///{tmp_path}/m.db") == f"sqlite:///{tmp_path}/m.db"  # four slashes: absolute
    assert tracking.absolute("sqlite:///:memory:") == "sqlite:///:memory:"
    assert tracking.absolute("http://h:5000/x") == "http://h:5000/x"
    assert (
        tracking.artifact_location(f"sqlite:///{tmp_path}/runs/m.db") == (tmp_path / "runs/mlflow-artifacts").as_uri()
    )
    assert tracking.artifact_location("http://h:5000") is None


def test_a_password_in_the_uri_is_never_shown():
    assert tracking.redacted("https://ann:s3cret@host:5000/x") == "https://ann:***@host:5000/x"
    assert tracking.redacted("https://ann@host:5000") == "https://ann@host:5000"
    assert tracking.redacted("sqlite:////a/b@c.db") == "sqlite:////a/b@c.db"  # an @ in a path is not a credential


def test_asking_for_mlflow_without_it_is_one_line_and_the_variable_alone_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(tracking, "installed", lambda: False)
    monkeypatch.setattr(tracking, "_warned", [])
    monkeypatch.delenv(tracking.URI_ENV, raising=False)
    with pytest.raises(ConfigError, match=r"output.mlflow='sqlite:///m.db': MLflow is not installed \(pip install"):
        tracking.check_available("sqlite:///m.db")
    tracking.check_available(None)  # not asked for: nothing
    tracking.check_available("off")
    monkeypatch.setenv(tracking.URI_ENV, "http://h:5000")
    with caplog.at_level(logging.WARNING, logger="ddplab"):
        tracking.check_available(None)
        tracking.check_available(None)  # once a process
    assert [r.getMessage() for r in caplog.records] == [
        "$MLFLOW_TRACKING_URI is set but MLflow is not installed: no run is tracked (pip install 'ddplab[mlflow]')"
    ]


def test_a_config_asking_for_mlflow_without_it_is_refused_before_spawning(monkeypatch, tmp_path):
    from ddplab.machine import check_environment

    from support.settings import tiny_config

    monkeypatch.setattr(tracking, "installed", lambda: False)
    with pytest.raises(ConfigError, match="MLflow is not installed"):
        check_environment(tiny_config(tmp_path / "run", output={"mlflow": "sqlite:///m.db"}))


def test_run_ids_round_trip_and_an_unreadable_file_means_a_new_run(tmp_path):
    ids = tracking.RunIds("sqlite:////x/m.db", "abc123", "7")
    ids.write(tmp_path)
    assert tracking.RunIds.read(tmp_path) == ids
    (tmp_path / tracking.FILE).write_text('{"uri": "x"')  # torn
    assert tracking.RunIds.read(tmp_path) is None
    assert tracking.RunIds.read(tmp_path / "missing") is None
    for edited in ('{"uri": 3, "run_id": "a", "experiment_id": "7"}', "[1, 2, 3]", '{"uri": "x"}'):
        (tmp_path / tracking.FILE).write_text(edited)  # another kind: a new run, never a traceback later
        assert tracking.RunIds.read(tmp_path) is None


def test_a_point_learns_its_parent_label_and_axes_from_its_environment(tmp_path, caplog):
    assert tracking.RunIds.read(tmp_path) is None  # the sweep is not tracked: no link
    tracking.RunIds("sqlite:////x/m.db", "parent1", "3").write(tmp_path)
    link = tracking.PointLink.under(tracking.RunIds.read(tmp_path), "bs-64", {"train.batch_size": "64"})
    assert link == tracking.PointLink("sqlite:////x/m.db", "parent1", "3", "bs-64", {"train.batch_size": "64"})
    assert tracking.PointLink.from_env(link.env()) == link
    assert link.params() == {"sweep.point": "bs-64", "sweep.axis.train.batch_size": "64"}
    assert tracking.PointLink.from_env({}) is None
    with caplog.at_level(logging.WARNING, logger="ddplab"):
        assert tracking.PointLink.from_env({tracking.POINT_ENV: "{not json"}) is None
    assert "is not what a ddplab sweep sets" in caplog.text


def test_a_tracker_fails_once_then_goes_quiet(caplog):
    tracker = tracking.Tracker("http://127.0.0.1:9")
    tracker._client = object()  # connected: the calls below fail in the client
    calls = []

    def broken(client):
        calls.append(1)
        raise ConnectionError("Connection refused\nmore lines")

    with caplog.at_level(logging.WARNING, logger="ddplab"):
        assert tracker.call("logging", broken) is None
        assert tracker.call("logging", broken) is None
    assert calls == [1]
    assert tracker.error == "logging: ConnectionError: Connection refused"
    assert len(caplog.records) == 1 and "goes on untracked" in caplog.text
    ids = tracking.RunIds(tracker.uri, "r1", "0")
    assert tracker.state(ids) == {
        "uri": "http://127.0.0.1:9",
        "run_id": "r1",
        "logged": False,
        "error": "logging: ConnectionError: Connection refused",
    }


def test_a_sqlite_stores_transient_error_is_tried_again_and_a_lasting_one_given_up_once(monkeypatch, caplog):
    """Two sweeps started together on a new SQLite store raced its creation: one went untracked for its whole
    run after one transient error. A store on this machine is tried again (after short waits); a server is not."""
    waits, calls = [], []
    monkeypatch.setattr(tracking.time, "sleep", waits.append)
    monkeypatch.setattr(tracking, "connect", lambda uri: object())

    def locked_twice(client):
        calls.append(1)
        if len(calls) <= 2:
            raise RuntimeError("(sqlite3.OperationalError) database is locked")
        return "experiment 1"

    tracker = tracking.Tracker("sqlite:////tmp/store/mlflow.db")
    assert tracker.call("opening experiment", locked_twice) == "experiment 1" and tracker.ok
    assert waits == list(tracking.LOCAL_STORE_WAITS_S[:2])

    def always_locked(client):
        raise RuntimeError("(sqlite3.OperationalError) database is locked")

    waits.clear()
    with caplog.at_level(logging.WARNING, logger="ddplab"):
        assert tracker.call("logging", always_locked) is None
    assert waits == list(tracking.LOCAL_STORE_WAITS_S) and not tracker.ok
    assert len(caplog.records) == 1 and "database is locked" in tracker.error
    waits.clear()
    server = tracking.Tracker("http://127.0.0.1:9")
    assert server.call("logging", always_locked) is None and waits == []  # a server: one try


def test_an_epoch_becomes_metrics_and_its_contention_system_metrics():
    record = epoch_record(3, test_acc=0.5, other_cpu_share=0.25, load_avg_1m=1.5)
    metrics = {name: (value, step) for name, value, step in epoch_metrics(record)}
    assert metrics["test_acc"] == (0.5, 3)
    assert metrics["system/other_cpu_share"] == (0.25, 3)
    assert metrics["system/load_avg_1m"] == (1.5, 3)
    assert "other_cpu_share" not in metrics and "epoch" not in metrics and "schema" not in metrics
    assert all(step == 3 for _, step in metrics.values())


def test_a_config_is_flattened_to_text_params():
    assert flat({"train": {"epochs": 3, "lr_scale": None, "amp": True}, "model": {"name": "resnet18"}}) == {
        "train.epochs": "3",
        "train.lr_scale": "null",
        "train.amp": "true",
        "model.name": "resnet18",
    }
    assert json.loads(flat({"a": {"b": [1, 2]}})["a.b"]) == [1, 2]


class FakeClient:
    """MlflowClient's calls that ddplab makes, recorded (the real store: tests/smoke/test_mlflow.py)."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            if name == "get_experiment_by_name":
                return None
            if name == "create_experiment":
                return "5"
            if name == "create_run":

                class Run:
                    class info:
                        run_id = "new1"

                return Run

        return call

    def named(self, name):
        return [(args, kwargs) for called, args, kwargs in self.calls if called == name]


def tracker_with(client, uri="sqlite:////x/m.db", what="this run"):
    tracker = tracking.Tracker(uri, what)
    tracker._client = client
    return tracker


def test_a_sweep_is_made_once_continued_by_a_rerun_and_ended_by_how_its_command_ended(tmp_path, capsys):
    tiers.importorskip("mlflow", "mlflow", "MLflow comes with the mlflow extra")  # log() builds MLflow's own entities
    client = FakeClient()
    sweep = tracking.SweepTracking("sqlite:////x/m.db", tmp_path)
    sweep.tracker._client = client
    sweep.start("sweep tiny", {"points": "2"})
    assert client.named("create_run") == [(("5",), {"run_name": "sweep tiny", "tags": {"ddplab.kind": "sweep"}})]
    assert [p.key for p in client.named("log_batch")[0][1]["params"]] == ["points"]
    assert tracking.RunIds.read(tmp_path) == tracking.RunIds("sqlite:////x/m.db", "new1", "5")
    assert "mlflow ui --backend-store-uri sqlite:////x/m.db" in capsys.readouterr().out
    sweep.stopped(KeyboardInterrupt())
    assert client.named("set_terminated")[-1] == (("new1",), {"status": "KILLED"})

    again = FakeClient()
    rerun = tracking.SweepTracking("sqlite:////x/m.db", tmp_path)
    rerun.tracker._client = again
    rerun.start("sweep tiny", {"points": "2"})
    assert again.named("update_run") == [(("new1",), {"status": "RUNNING"})]
    assert again.named("create_run") == [] and again.named("log_batch") == []  # its params are there
    (tmp_path / "report").mkdir()
    rerun.end([tmp_path / "report", tmp_path / "missing.json"], finished=False)
    assert again.named("log_artifacts") == [(("new1", str(tmp_path / "report"), "report"), {})]
    assert again.named("log_artifact") == []
    assert again.named("set_terminated")[-1] == (("new1",), {"status": "FAILED"})
    rerun.stopped(ValueError())
    assert again.named("set_terminated")[-1] == (("new1",), {"status": "FAILED"})


def test_a_run_in_another_store_is_a_new_run_there(tmp_path):
    client = FakeClient()
    tracker = tracker_with(client, uri="http://other:5000")
    ids = tracker.start(tracking.RunIds("sqlite:////x/m.db", "old", "1"), None, "run", {})
    assert ids == tracking.RunIds("http://other:5000", "new1", "5")
    assert client.named("update_run") == []


@pytest.mark.parametrize(
    "error, status", [(None, "KILLED"), (KeyboardInterrupt(), "KILLED"), (RuntimeError("boom"), "FAILED")]
)
def test_a_run_that_did_not_finish_ends_failed_or_killed(tmp_path, monkeypatch, error, status):
    tiers.importorskip("mlflow", "mlflow", "MLflow comes with the mlflow extra")
    from ddplab.metrics.mlflow_sink import MlflowSink

    from support.settings import tiny_config

    client = FakeClient()
    monkeypatch.setattr(tracking, "connect", lambda uri: client)
    sink = MlflowSink(tiny_config(tmp_path), tmp_path, "sqlite:////x/m.db")
    sink.close(error)
    sink.close(error)  # once
    assert client.named("set_terminated") == [(("new1",), {"status": status})]
    assert sink.tracking() == {"mlflow": {"uri": "sqlite:////x/m.db", "run_id": "new1", "logged": True, "error": None}}
