"""Metric sinks: JSONL rewrite on resume, TensorBoard scalars, progress bar, summary text."""

import json

import pytest

from ddplab.metrics.sinks import JsonlSink, ProgressBar, SinkGroup, tensorboard_sink

from support.runs import epoch_record


def record(epoch, acc):
    return epoch_record(epoch, train_loss=1.0 / epoch, test_acc=acc, epoch_s=2.5)


def test_jsonl_rewrites_history_then_appends(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        json.dumps(record(1, 0.1).to_json())
        + "\n"
        + json.dumps(record(2, 0.2).to_json())
        + "\n"
        + json.dumps(record(3, 0.3).to_json())
        + "\n"
    )
    # Resumed from a checkpoint after epoch 2: epoch 3 of the crashed run must go.
    sink = JsonlSink(path, history=[record(1, 0.1), record(2, 0.2)])
    sink.epoch_end(record(3, 0.35))
    assert [json.loads(line)["test_acc"] for line in path.read_text().splitlines()] == [0.1, 0.2, 0.35]


def test_tensorboard_events_hold_the_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = tensorboard_sink(tmp_path)
    for epoch in (1, 2):
        sink.epoch_end(record(epoch, 0.5 * epoch))
    sink.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert {"train/loss", "test/acc", "epoch_s"} <= set(events.Tags()["scalars"])
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("test/acc")] == [(1, 0.5), (2, 1.0)]


def test_progress_bar_shows_loss_and_throughput(capsys):
    bar = ProgressBar(epochs=3, enabled=True)
    group = SinkGroup([bar])
    group.epoch_start(1, 4)
    for i in range(4):
        group.step(128, 2.3456 if i == 3 else None)
    group.epoch_end(record(1, 0.5))
    err = capsys.readouterr().err
    assert "epoch 1/3" in err and "loss=2.3456" in err and "img_s=" in err and "4/4" in err


def test_progress_bar_is_silent_when_disabled(capsys):
    bar = ProgressBar(epochs=1, enabled=False)
    bar.epoch_start(1, 2)
    bar.step(1, 1.0)
    bar.close()
    assert capsys.readouterr().err == ""


def test_a_run_writes_tensorboard_scalars_that_tensorboard_reads_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    import ddplab

    from support.settings import tiny_config

    result = ddplab.train(tiny_config(tmp_path / "r", train={"epochs": 2}, output={"tensorboard": True}))
    events = EventAccumulator(str(tmp_path / "r" / "tensorboard"))
    events.Reload()
    for tag, key in (("train/loss", "train_loss"), ("test/acc", "test_acc"), ("images_per_s", "images_per_s")):
        scalars = events.Scalars(tag)
        assert [s.step for s in scalars] == [1, 2], tag
        assert [s.value for s in scalars] == pytest.approx([r.metric(key) for r in result.history], rel=1e-6), tag


def test_the_main_rank_gets_every_registered_sink_the_run_asks_for_in_order(tmp_path, monkeypatch):
    """SINKS is the one list a new sink joins; a maker that answers None (TensorBoard off) adds nothing."""
    from ddplab.config import build_config
    from ddplab.metrics import sinks

    off = build_config({"output": {"tensorboard": False, "progress": False}})
    kinds = [type(s).__name__ for s in sinks.run_sinks(off, tmp_path, []).sinks]
    assert kinds == ["JsonlSink", "SamplesSink", "ProgressBar", "LogSink"]

    class Extra(sinks.NullSink):
        pass

    monkeypatch.setattr(sinks, "SINKS", (*sinks.SINKS, lambda config, run_dir, history: Extra()))
    assert type(sinks.run_sinks(off, tmp_path, []).sinks[-1]) is Extra


def test_a_resume_keeps_the_samples_of_its_epochs_and_drops_torn_or_edited_lines(tmp_path):
    """steps.jsonl's rows of epochs after the checkpoint go; a torn line or an epoch that is not a number (an edit)
    goes too, where it was a TypeError that stopped the resume."""
    from ddplab.metrics.sinks import SamplesSink

    rows = ['{"epoch": 1, "loss": 1.0}', '{"epoch": "2", "loss": 0.9}', '{"epoch": 2, "lo', '{"epoch": 3, "loss": 0.8}']
    (tmp_path / "steps.jsonl").write_text("\n".join(rows) + "\n")
    SamplesSink(tmp_path, keep_through_epoch=2)
    assert (tmp_path / "steps.jsonl").read_text() == '{"epoch": 1, "loss": 1.0}\n'
