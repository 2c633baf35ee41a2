"""A run folder read back (runread.py): an unfinished run comes back with what it left, a bad record costs one line."""

import pytest
import tomli_w

from ddplab.report.build import build_report

from support.reports import read_csv
from support.runs import epoch_line, write_run


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


@pytest.mark.parametrize(
    "bad_line",
    [
        b'{"step": "x", "loss": 1.0}',  # an edited value
        b'{"step": 3, "lo',  # a truncated write
        b"\xff\xfe not UTF-8",  # bytes from elsewhere
        b"[1, 2]",  # JSON, not an object
    ],
)
def test_a_side_record_that_cannot_be_used_is_left_out_and_said_and_the_run_drawn(tmp_path, bad_line):
    """One bad line of steps.jsonl or gpu.jsonl costs that line, not the run: the report drew every finished
    run, and its findings say what was left out (it was an "unreadable" run for a truncated or non-UTF-8 line)."""
    run = write_run(tmp_path / "runs" / "edited", steps=True)
    lines = (run / "steps.jsonl").read_bytes().splitlines()
    (run / "steps.jsonl").write_bytes(b"\n".join([bad_line, *lines[1:]]) + b"\n")
    (run / "gpu.jsonl").write_bytes(b"\x80\x81\n")
    result = build_report([tmp_path / "runs"], tmp_path / "out")
    assert result["num_finished"] == 1
    assert (
        f"run edited: 1 of {len(lines)} records of steps.jsonl left out (lines that are not UTF-8 JSON objects of "
        "numbers: truncated or edited?)" in result["findings"]
    )
    assert any("1 of 1 records of gpu.jsonl left out" in line for line in result["findings"])
