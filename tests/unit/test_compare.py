"""`ddplab compare`: scaling figures computed from run folders alone."""

import json

import pytest

from ddplab.cli import main
from ddplab.report.compare import load_run, scaling_rows


def fake_run(root, name, world, images_per_epoch, train_s, comm_s, acc):
    run = root / name
    run.mkdir()
    summary = {"run": {"strategy": "ddp" if world > 1 else "single", "world_size": world, "precision": "fp32"},
               "batch": {"local": 64, "global": 64 * world}, "final": {"test_acc": acc}, "memory": {"peak_rss_mib": 900.0}}
    (run / "summary.json").write_text(json.dumps(summary))
    epochs = [{"epoch": e, "train_s": train_s * (3 if e == 1 else 1), "epoch_s": train_s + 1, "train_samples": images_per_epoch,
               "data_s": 0.1 * train_s, "forward_backward_s": 0.8 * train_s, "optimizer_s": 0.0, "comm_wait_s": comm_s}
              for e in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in epochs))
    return run


def test_speedup_and_efficiency_against_the_smallest_world(tmp_path):
    one = fake_run(tmp_path, "one", 1, 50_000, 100.0, 0.0, 0.70)
    four = fake_run(tmp_path, "four", 4, 50_000, 40.0, 4.0, 0.69)
    rows = {r["run"]: r for r in scaling_rows([load_run(four), load_run(one)])}
    assert rows["one"]["images_per_s"] == pytest.approx(500.0)  # first (warm-up) epoch left out
    assert rows["four"]["speedup"] == pytest.approx(2.5) and rows["four"]["efficiency"] == pytest.approx(0.625)
    assert rows["four"]["comm_wait_share"] == pytest.approx(0.1) and rows["four"]["data_share"] == pytest.approx(0.1)
    assert rows["one"]["speedup"] == 1.0 and rows["four"]["global_batch"] == 256


def test_compare_command_prints_table_and_refuses_non_runs(tmp_path, capsys):
    fake_run(tmp_path, "a", 1, 1000, 10.0, 0.0, 0.5)
    assert main(["compare", str(tmp_path / "a")]) == 0
    assert "speedup" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert main(["compare", str(tmp_path / "empty")]) == 2
    assert "not a finished ddplab run" in capsys.readouterr().err
