"""An MLflow store read back through MlflowClient, for the tests that track runs (tests/smoke/test_mlflow.py, the
parallel sweep of tests/smoke/test_sweep_runs.py)."""

import json
from pathlib import Path

from ddplab import tracking


def client(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def runs_of(uri):
    c = client(uri)
    experiment = c.get_experiment_by_name(tracking.EXPERIMENT)
    return c.search_runs([experiment.experiment_id]) if experiment else []


def history(uri, run_id, name):
    return [(m.step, m.value) for m in sorted(client(uri).get_metric_history(run_id, name), key=lambda m: m.step)]


def artifacts(uri, run_id, path=None):
    return sorted(a.path for a in client(uri).list_artifacts(run_id, path))


def assert_sweep_tracked(uri: str, sweep_dir: Path, epochs: int) -> None:
    """The tiny sweep (support.sweeps.THREE_POINTS) as MLflow holds it: one parent run with the report and the
    manifest, a child per point with its label and axis value, the DDP point's epochs logged once (by rank 0)."""
    runs = {r.info.run_name: r for r in runs_of(uri)}
    assert set(runs) == {"sweep tiny", "a", "b", "ddp"}  # one run per point: the DDP point's rank 1 logs nothing
    parent = runs["sweep tiny"]
    assert parent.info.status == "FINISHED" and parent.data.params["points"] == "3"
    assert json.loads((sweep_dir / "mlflow.json").read_text())["run_id"] == parent.info.run_id
    assert {"manifest.json", "report"} <= set(artifacts(uri, parent.info.run_id))
    assert "report/index.html" in artifacts(uri, parent.info.run_id, "report")
    ddp = runs["ddp"]
    assert ddp.data.tags["ddplab.world_size"] == "2" and ddp.data.params["dist.nproc"] == "2"
    assert [step for step, _ in history(uri, ddp.info.run_id, "test_acc")] == list(range(1, epochs + 1))
    for label, lr in (("a", "0.01"), ("b", "0.05"), ("ddp", "0.05")):
        child = runs[label]
        assert child.info.status == "FINISHED"
        assert child.data.tags[tracking.PARENT_TAG] == parent.info.run_id
        assert child.data.params["sweep.point"] == label and child.data.params["optim.lr"] == lr
        assert child.data.params["sweep.axis.variant"] == label
        assert artifacts(uri, child.info.run_id) == ["config.toml", "summary.json"]  # its figures: the parent's report
        summary = json.loads((sweep_dir / "runs" / label / "summary.json").read_text())
        assert summary["tracking"]["mlflow"] == {"uri": uri, "run_id": child.info.run_id, "logged": True, "error": None}
