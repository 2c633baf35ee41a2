"""A run folder read back (runread.py): an unfinished run comes back with what it left, a bad record costs one line."""

import json

import tomli_w

from ddplab.report.build import build_report

from report_folders import read_csv
from run_folders import epoch_line, write_run


def test_unfinished_run_is_listed_not_fatal(tmp_path):
    write_run(tmp_path / "runs" / "done")
    crashed = tmp_path / "runs" / "crashed"
    crashed.mkdir()
    (crashed / "config.toml").write_text(tomli_w.dumps({"train": {"seed": 0}}))
    (crashed / "env.json").write_text("{}")
    (crashed / "metrics.jsonl").write_text(epoch_line(1))
    (crashed / "train.log").write_text("epoch 1/3 ...\nTrainingError: loss is nan\n")
    result = build_report([tmp_path / "runs"], tmp_path / "out")
    assert (result["num_runs"], result["num_finished"], result["num_points"]) == (2, 1, 1)
    rows = {r["run"]: r for r in read_csv(result["runs_csv"])}
    assert rows["crashed"]["status"] == "unfinished"
    assert (
        rows["crashed"]["error"]
        == "no summary.json: stopped or still running after 1 epoch; log: TrainingError: loss is nan"
    )


def test_records_that_are_not_numbers_are_left_out_and_said(tmp_path):
    """An edited steps.jsonl line (a string step) costs that line, not the report; the findings say so."""
    run = write_run(tmp_path / "runs" / "edited", steps=True)
    lines = (run / "steps.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    record["step"] = "x"
    (run / "steps.jsonl").write_text("\n".join([json.dumps(record), *lines[1:]]) + "\n")
    result = build_report([tmp_path / "runs"], tmp_path / "out")
    assert result["num_finished"] == 1
    assert (
        f"run edited: 1 of {len(lines)} records of steps.jsonl left out (values that are not numbers)"
        in result["findings"]
    )
