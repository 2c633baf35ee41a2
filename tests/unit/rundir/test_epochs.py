"""The epoch record and the summary's schema: written and read by one module, old folders still read."""

import json
import math

import pytest

from ddplab.errors import DataError
from ddplab.rundir.epochs import SCHEMA_VERSION, EpochRecord, read_epochs, reproducible, worst_reading
from ddplab.rundir.summary import read_summary

from support.runs import epoch_fields, epoch_line, epoch_record


def test_a_record_survives_its_file_format_and_keeps_each_ranks_lists_apart():
    record = epoch_record(
        2,
        data_s=0.25,
        comm_wait_s=0.5,
        other_cpu_share=0.125,
        peak_rss_mib=400.0,
        rank_cpu_s=[1.5, 1.25],
        rank_samples=[64.0, 64.0],
    )
    assert record.per_rank == {"cpu_s": [1.5, 1.25], "samples": [64.0, 64.0]}
    assert record.data_s == 0.25 and record.optimizer_s is None and record.schema == 1  # read from a schema-1 line
    written = EpochRecord(**{**record.__dict__, "schema": SCHEMA_VERSION}).to_json()
    assert written["schema"] == SCHEMA_VERSION and written["rank_cpu_s"] == [1.5, 1.25]
    assert "optimizer_s" not in written and "per_rank" not in written  # not measured: left out
    again = EpochRecord.from_json(json.loads(json.dumps(written)))
    assert again.to_json() == written and again.schema == SCHEMA_VERSION


def test_a_record_written_before_the_schema_was_is_read_as_schema_1():
    old = epoch_fields(1)
    assert "schema" not in old
    assert EpochRecord.from_json(old).schema == 1 and EpochRecord.from_json(old).test_acc == 0.5


@pytest.mark.parametrize(
    "change, says",
    [
        ({"schema": SCHEMA_VERSION + 1}, f"has schema {SCHEMA_VERSION + 1}"),
        ({"schema": "2"}, "has schema '2'"),
        ({"test_acc": None}, "lacks test_acc"),
        ({"test_acc": "0.5"}, "test_acc is '0.5', not a number from 0 to 1"),
        ({"epoch": True}, "epoch is true, not a whole number >= 1"),
        ({"epoch": 0}, "epoch is 0, not a whole number >= 1"),
        ({"train_s": float("inf")}, "train_s is inf, not a number >= 0"),
        ({"images_per_s": -3.0}, "images_per_s is -3.0, not a number >= 0"),
        ({"rank_cpu_s": 1.5}, "rank_cpu_s is 1.5, not a list, each item a number or null"),
        ({"rank_cpu_s": [1e308]}, "rank_cpu_s is [1e+308], not a list, each item a number or null"),
        ({"gpu_peak_alloc_mib": ["a"]}, "gpu_peak_alloc_mib is ['a'], not a list, each item a number >= 0 or null"),
    ],
)
def test_a_record_ddplab_did_not_write_is_one_line_naming_the_field(change, says):
    with pytest.raises(DataError, match="line 7") as err:
        EpochRecord.from_json({**epoch_fields(1), **change}, "metrics.jsonl line 7")
    assert says in str(err.value)
    with pytest.raises(DataError, match="is not a JSON object"):
        EpochRecord.from_json([1, 2])


def test_only_scalar_fields_are_metrics():
    record = epoch_record(1)
    assert record.metric("test_loss") == 1.0 and record.metric("data_s") is None
    for name in ("gpu_peak_alloc_mib", "per_rank", "schema", "nope"):
        with pytest.raises(KeyError):
            record.metric(name)


def test_a_growing_file_gives_its_whole_lines_and_a_finished_one_names_the_bad_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(epoch_line(1) + epoch_line(2) + epoch_line(3)[:15])
    assert [r.epoch for r in read_epochs(path, growing=True)] == [1, 2]
    assert read_epochs(tmp_path / "none.jsonl", growing=True) == []
    with pytest.raises(DataError, match="line 3"):
        read_epochs(path)
    path.write_text(epoch_line(1) + json.dumps({"epoch": 2}) + "\n")
    with pytest.raises(DataError, match=r"metrics.jsonl line 2 lacks step"):
        read_epochs(path)


OLD_SUMMARY = {
    "status": "finished",
    "run": {
        "dataset": "synthetic",
        "model": "simple_cnn",
        "strategy": "single",
        "world_size": 1,
        "device": "cpu",
        "precision": "fp32",
    },
    "batch": {"local": 32, "global": 32},
    "model": {"params": 1000, "flops_per_image": 2e6},
    "data": {"train_images": 256, "eval_images": 64},
    "final": {"test_acc": 0.5, "train_acc": 0.6, "test_loss": 1.2},
    "best": {"epoch": 1, "test_acc": 0.5},
    "time": {"train_s": 1.0, "total_s": 2.0},
}


def test_the_summary_schema_is_checked_and_an_old_summary_is_read(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps(OLD_SUMMARY))  # no schema: version 1, fewer fields
    assert read_summary(tmp_path) == OLD_SUMMARY
    (tmp_path / "summary.json").write_text(json.dumps({**OLD_SUMMARY, "schema": SCHEMA_VERSION + 1}))
    with pytest.raises(DataError, match="written by a newer ddplab"):
        read_summary(tmp_path)
    (tmp_path / "summary.json").write_text("[]")
    with pytest.raises(DataError, match="not a JSON object"):
        read_summary(tmp_path)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: s["run"].pop("world_size"), r"summary\.json lacks run\.world_size, which ddplab always writes"),
        (lambda s: s["run"].update(world_size=0), r"summary\.json: run\.world_size is 0, not a whole number >= 1$"),
        (lambda s: s["batch"].update(local="32"), r"batch\.local is '32', not a whole number >= 1$"),
        (
            lambda s: s["batch"].update(local=10**400),
            r"batch\.local is 100000000000\.\.\. \(401 digits\), not a whole number",
        ),
        (lambda s: s["time"].update(train_s=float("nan")), r"time\.train_s is nan, not a number >= 0$"),
        (lambda s: s["time"].update(total_s=1e308), r"time\.total_s is 1e\+308, not a number >= 0$"),
        (lambda s: s["final"].update(test_acc=1.5), r"final\.test_acc is 1\.5, not a number from 0 to 1 or null$"),
        (lambda s: s.update(run="single"), r"summary\.json: run is 'single', not a JSON object$"),
        (lambda s: s["run"].update(device=None), r"run\.device is null, not text$"),
        (lambda s: s.update(status="done"), r"status is 'done', not one of finished, stopped_early$"),
        (
            lambda s: s.update(ranks={"cpu_s": {"per_rank": [1.0, "x"], "max": 1.0, "mean": 1.0}}),
            r"ranks\.cpu_s\.per_rank is \[1\.0, 'x'\], not a list, each item a number or null$",
        ),
        (lambda s: s.update(memory={"peak_rss_mib": -1}), r"memory\.peak_rss_mib is -1, not a number >= 0$"),
    ],
    ids=[
        "missing",
        "zero-count",
        "text-for-a-count",
        "400-digits",
        "nan",
        "1e308",
        "accuracy-past-1",
        "not-an-object",
        "null-text",
        "unknown-status",
        "a-rank-list",
        "negative-memory",
    ],
)
def test_a_summary_field_that_is_not_what_ddplab_writes_is_named(tmp_path, edit, message):
    summary = json.loads(json.dumps(OLD_SUMMARY))
    edit(summary)
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(DataError, match=message):
        read_summary(tmp_path)


def test_what_two_runs_of_one_config_share_leaves_the_machine_out():
    record = epoch_record(1, data_s=0.2, load_avg_1m=3.0, gpu_other_processes=0, rank_samples=[64.0], rank_cpu_s=[1.0])
    kept = reproducible(record)
    assert "rank_samples" in kept and not {
        "data_s",
        "load_avg_1m",
        "gpu_other_processes",
        "rank_cpu_s",
        "epoch_s",
        "images_per_s",
    } & set(kept)
    assert "rank_samples" not in reproducible(record, per_rank=False)
    assert reproducible(record) == reproducible(record.to_json())  # a line read back as JSON compares the same


def test_the_worst_reading_skips_what_was_not_measured():
    records = [epoch_record(1, other_cpu_share=0.1), epoch_record(2, other_cpu_share=math.nan), epoch_record(3)]
    assert worst_reading(records, "other_cpu_share") == 0.1 and worst_reading(records, "steal_share") is None


def test_a_checkpoint_written_before_the_records_were_typed_resumes(tmp_path):
    from ddplab.engine.state import TrainState

    state = TrainState()
    state.load_state_dict({"epoch": 1, "step": 4, "history": [epoch_fields(1, rank_cpu_s=[1.0])]})
    assert state.history == [epoch_record(1, rank_cpu_s=[1.0])]
    again = TrainState()
    again.load_state_dict(state.state_dict())
    assert again == state and isinstance(state.state_dict()["history"][0], dict)


def test_a_run_writes_the_schema_it_was_written_with(tiny_run):
    result = tiny_run(train={"epochs": 1})
    line = json.loads((result.run_dir / "metrics.jsonl").read_text())
    assert line["schema"] == result.summary["schema"] == SCHEMA_VERSION
    assert read_epochs(result.run_dir / "metrics.jsonl") == result.history
    assert result.history[0].per_rank["samples"] == [256.0] and result.history[0].per_rank["cpu_s"][0] > 0
