"""Run folders found and grouped into points (report/runs.py): every run listed, finished or not, each folder once."""

import pytest

from ddplab.report.build import build_report
from ddplab.report.runs import group_points, load_runs

from support.reports import read_csv
from support.runs import write_manifest, write_run


def test_runs_csv_lists_every_run_with_failures_and_their_errors(sweep_report):
    rows = {r["run"]: r for r in read_csv(sweep_report[0]["runs_csv"])}
    assert list(rows) == ["w1-s0", "w1-s1", "w2-s0", "w2-s1", "w4-s0"]
    assert rows["w1-s1"]["point"] == "workers=1" and rows["w1-s1"]["seed"] == "1"
    assert float(rows["w1-s1"]["final_test_acc"]) == pytest.approx(0.72)
    assert float(rows["w2-s0"]["epoch_s"]) == pytest.approx(6.25)
    failed = rows["w4-s0"]
    assert failed["status"] == "failed" and failed["error"] == "training diverged: loss is nan at epoch 2"
    assert failed["final_test_acc"] == ""


def test_runs_differing_only_in_seed_and_output_form_one_point(tmp_path):
    write_run(tmp_path / "a", seed=0, test_acc=0.70)
    write_run(tmp_path / "b", seed=1, test_acc=0.72)
    write_run(tmp_path / "c", seed=0, batch=64)
    points = group_points(load_runs([tmp_path]))
    assert [(p.label, len(p.runs)) for p in points] == [("batch_size=32", 2), ("batch_size=64", 1)]
    assert points[0].axes == {"train.batch_size": 32}


def test_a_half_finished_slurm_sweep_reports_its_finished_points_and_names_the_rest(tmp_path):
    """Slurm tasks finish after the manifest was written ("submitted"): the run folders say which finished."""
    write_run(tmp_path / "runs" / "done")
    write_manifest(
        tmp_path,
        [
            {"name": "done", "point": {"config": "a"}, "seed": 0, "status": "submitted", "job": "7_0"},
            {"name": "queued", "point": {"config": "b"}, "seed": 0, "status": "submitted", "job": "7_1"},
        ],
    )
    result = build_report([tmp_path], tmp_path / "out")
    assert (result["num_runs"], result["num_finished"]) == (2, 1)
    rows = {r["run"]: r for r in read_csv(result["runs_csv"])}
    assert rows["done"]["status"] == "finished" and rows["done"]["final_test_acc"] == "0.7"
    assert (rows["queued"]["status"], rows["queued"]["error"]) == (
        "submitted",
        "submitted: not finished when the report was made",
    )


def test_a_folder_linking_to_itself_is_read_once(tmp_path):
    write_run(tmp_path / "runs" / "a")
    (tmp_path / "runs" / "latest").symlink_to(".")
    assert [r.name for r in load_runs([tmp_path / "runs"])] == ["a"]
