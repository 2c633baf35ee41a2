"""`build_report`: run and sweep folders in, exact tables, findings, PNGs and one offline HTML page out."""

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from ddplab.config import tomllib  # tomli on Python 3.10
from ddplab.errors import ConfigError, DataError
from ddplab.report.build import build_report
from ddplab.report.findings import compare_sentence, noise_text, overfitting
from ddplab.report.runs import group_points, load_runs
from run_folders import write_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
def write_sweep(root: Path) -> Path:
    """1 worker vs DDP x2, two seeds each, plus one failed run: epoch times 10 s and 6.25 s after the first."""
    sweep = root / "sweep"
    entries = []
    for workers, seed, acc in (("1", 0, 0.70), ("1", 1, 0.72), ("2", 0, 0.69), ("2", 1, 0.69)):
        name = f"w{workers}-s{seed}"
        if workers == "1":
            write_run(sweep / "runs" / name, seed=seed, test_acc=acc, steps=True, gpu=seed == 0)
        else:
            write_run(sweep / "runs" / name, seed=seed, strategy="ddp", nproc=2, test_acc=acc, epoch_s=(8.0, 6.25, 6.25),
                      test_loss=(1.0, 0.9, 0.85), comm_share=0.1, peak_mib=450.0)
        entries.append({"name": name, "dir": f"runs/{name}", "point": {"workers": workers}, "seed": seed,
                        "status": "finished", "exit_code": 0, "error": None, "wall_s": 40.0})
    entries.append({"name": "w4-s0", "dir": "runs/w4-s0", "point": {"workers": "4"}, "seed": 0, "status": "failed",
                    "exit_code": 4, "error": "training diverged: loss is nan at epoch 2", "wall_s": 3.0})
    manifest = {"version": 1, "name": "scaling", "description": "", "sweep_file": "scaling.toml", "axes": ["workers"],
                "repeats": 2, "runs": entries}
    (sweep / "manifest.json").write_text(json.dumps(manifest))
    return sweep


@pytest.fixture(scope="module")
def sweep_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    sweep = write_sweep(root)
    return build_report([sweep], root / "out"), root


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_points_average_seeds_and_scale_against_the_one_worker_point(sweep_report):
    result, _ = sweep_report
    assert (result["num_runs"], result["num_points"], result["num_not_finished"]) == (5, 2, 1)
    points = {r["point"]: r for r in read_csv(result["points_csv"])}
    one, two = points["workers=1"], points["workers=2"]
    assert one["workers"] == "1" and one["seeds"] == "2" and one["world_size"] == "1" and two["world_size"] == "2"
    assert float(one["final_test_acc"]) == pytest.approx(0.71)
    assert float(one["final_test_acc_std"]) == pytest.approx(0.0141421356)  # sample std of 0.70, 0.72
    assert float(two["epoch_s"]) == pytest.approx(6.25)  # the first epoch is left out
    assert float(two["speedup"]) == pytest.approx(1.6) and float(two["efficiency"]) == pytest.approx(0.8)
    assert float(one["speedup"]) == pytest.approx(1.0) and two["baseline"] == "workers=1"
    assert float(two["comm_wait_share"]) == pytest.approx(0.1) and float(one["data_share"]) == pytest.approx(0.1)
    assert float(one["images_per_s"]) == pytest.approx(2000 / 18)
    assert float(two["peak_mib"]) == 450.0 and two["memory_label"] == "peak_rss_mib" and two["backend"] == "gloo"


def test_findings_say_speedup_efficiency_overfitting_and_failures(sweep_report):
    findings = sweep_report[0]["findings"]
    assert "ddp x2 (batch 32): 1.60x faster per epoch than 1 worker, 80% efficiency, communication 10% of step time" in findings
    assert ("workers=1 (mean of 2 seeds) overfits from epoch 2: test loss +25% from its minimum while train loss falls; "
            "train-test accuracy gap 20.0 points") in findings
    assert not any(f.startswith("workers=2") and "overfits" in f for f in findings)
    assert "best accuracy: workers=1, 71.00% ± 1.41 final test accuracy" in findings
    assert "1 run did not finish (1 failed): listed at the end" in findings


def test_runs_csv_lists_every_run_with_failures_and_their_errors(sweep_report):
    rows = {r["run"]: r for r in read_csv(sweep_report[0]["runs_csv"])}
    assert list(rows) == ["w1-s0", "w1-s1", "w2-s0", "w2-s1", "w4-s0"]
    assert rows["w1-s1"]["point"] == "workers=1" and rows["w1-s1"]["seed"] == "1"
    assert float(rows["w1-s1"]["final_test_acc"]) == pytest.approx(0.72)
    assert float(rows["w2-s0"]["epoch_s"]) == pytest.approx(6.25)
    failed = rows["w4-s0"]
    assert failed["status"] == "failed" and failed["error"] == "training diverged: loss is nan at epoch 2"
    assert failed["final_test_acc"] == ""


def test_markdown_has_tables_with_mean_and_std(sweep_report):
    md = sweep_report[0]["report_md"].read_text()
    assert "| workers=1 | 1 | 2 | single | 1 | 32/32 | fp32 | none | 71.00 ± 1.41 |" in md
    assert "1.60x | 80% |" in md
    assert "- w4-s0 (failed): training diverged: loss is nan at epoch 2" in md


def test_html_is_self_contained_with_embedded_pngs(sweep_report):
    result, _ = sweep_report
    page = result["index_html"].read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*https?:""", page, re.I)
    assert "http://" not in page and "https://" not in page and "<script" not in page.lower()
    assert page.count('src="data:image/png;base64,') == len(result["plots"])
    names = {p.name for p in result["plots"]}
    assert {"loss_curves.png", "accuracy_curves.png", "step_loss.png", "accuracy_vs_time.png", "throughput.png",
            "time_breakdown.png", "gpu_utilization.png"} <= names
    assert "batch_size.png" not in names  # batch size does not vary here
    assert "GPU utilization: not measured" not in page and "training diverged" in page
    for path in result["plots"]:
        assert path.read_bytes().startswith(PNG_MAGIC)


def test_text_from_runs_is_escaped_in_html(tmp_path):
    write_run(tmp_path / "runs" / "<em>x&y")
    page = build_report([tmp_path / "runs"], tmp_path / "out", title="a <script> title")["index_html"].read_text()
    assert "<em>x&y" not in page and "&lt;em&gt;x&amp;y" in page and "<script>" not in page
    assert "GPU utilization: not measured" in page


def test_runs_differing_only_in_seed_and_output_form_one_point(tmp_path):
    write_run(tmp_path / "a", seed=0, test_acc=0.70)
    write_run(tmp_path / "b", seed=1, test_acc=0.72)
    write_run(tmp_path / "c", seed=0, batch=64)
    points = group_points(load_runs([tmp_path]))
    assert [(p.label, len(p.runs)) for p in points] == [("batch_size=32", 2), ("batch_size=64", 1)]
    assert points[0].axes == {"train.batch_size": 32}


def test_one_field_changes_compare_speed_accuracy_and_noise(tmp_path):
    for name, precision, seed, acc, epoch in (("a0", "fp32", 0, 0.70, 10.0), ("a1", "fp32", 1, 0.72, 10.0),
                                              ("b0", "bf16", 0, 0.69, 8.0), ("b1", "bf16", 1, 0.71, 8.0)):
        write_run(tmp_path / "runs" / name, precision=precision, seed=seed, test_acc=acc, epoch_s=(epoch, epoch),
                  train_loss=(1.0, 0.9), test_loss=(1.0, 0.95))
    result = build_report([tmp_path / "runs"], tmp_path / "out")
    assert "train.precision=bf16 vs fp32: 1.25x faster, -1.0 points accuracy, within noise (std 1.4)" in result["findings"]
    assert "fastest: precision=bf16, 8.00 s per epoch (143 images/s)" in result["findings"]
    assert ("precision=fp32 (mean of 2 seeds): train accuracy 20.0 points above test, though test loss has not "
            "risen 10% above its minimum") in result["findings"]
    assert not any("overfits" in f for f in result["findings"])


def test_noise_verdicts():
    base = {"epoch_s": 10.0, "final_test_acc": 0.70, "final_test_acc_std": None}
    new = {"epoch_s": 12.5, "final_test_acc": 0.73, "final_test_acc_std": None}
    assert compare_sentence("x=1 vs 0", new, base) == "x=1 vs 0: 1.25x slower, +3.0 points accuracy, single seed: noise not measured"
    assert noise_text(3.0, [0.01, 0.005]) == "beyond noise (std 1.0)"
    assert noise_text(-2.0, [0.01, None]) == "within noise (std 1.0)"


def test_overfitting_needs_test_loss_up_10_percent_while_train_loss_falls():
    def curve(train, test):
        return [{"epoch": i, "train_loss": a, "test_loss": b} for i, (a, b) in enumerate(zip(train, test), 1)]

    assert overfitting(curve([1.0, 0.8, 0.6, 0.4], [1.0, 0.5, 0.6, 0.7])) == {"epoch": 2, "rise": pytest.approx(0.4)}
    assert overfitting(curve([1.0, 0.8, 0.6, 0.4], [1.0, 0.5, 0.52, 0.55])) is None  # +10% exactly: not beyond
    assert overfitting(curve([1.0, 0.5, 0.6, 0.7], [1.0, 0.5, 0.6, 0.7])) is None  # train loss rises too: diverging
    assert overfitting(curve([1.0], [1.0])) is None


def test_batch_size_plot_when_batch_varies(tmp_path):
    for batch, epoch, peak in ((16, 12.0, 200.0), (32, 10.0, 400.0), (64, 9.0, 800.0)):
        write_run(tmp_path / "runs" / f"b{batch}", batch=batch, epoch_s=(epoch, epoch), peak_mib=peak,
                  train_loss=(1.0, 0.9), test_loss=(1.0, 0.95))
    result = build_report([tmp_path / "runs"], tmp_path / "out")
    names = {p.name for p in result["plots"]}
    assert "batch_size.png" in names and "throughput.png" not in names and "step_loss.png" not in names
    assert "train.batch_size=32 vs 16: 1.20x faster, +0.0 points accuracy, single seed: noise not measured, " \
           "peak memory 400 vs 200 MiB" in result["findings"]


def test_unfinished_run_is_listed_not_fatal(tmp_path):
    write_run(tmp_path / "runs" / "done")
    crashed = tmp_path / "runs" / "crashed"
    crashed.mkdir()
    (crashed / "config.toml").write_text(tomli_w.dumps({"train": {"seed": 0}}))
    (crashed / "env.json").write_text("{}")
    (crashed / "metrics.jsonl").write_text(json.dumps({"epoch": 1}) + "\n")
    (crashed / "train.log").write_text("epoch 1/3 ...\nTrainingError: loss is nan\n")
    result = build_report([tmp_path / "runs"], tmp_path / "out")
    assert (result["num_runs"], result["num_finished"], result["num_points"]) == (2, 1, 1)
    rows = {r["run"]: r for r in read_csv(result["runs_csv"])}
    assert rows["crashed"]["status"] == "unfinished"
    assert rows["crashed"]["error"] == "no summary.json: stopped or still running after 1 epoch; log: TrainingError: loss is nan"


def one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message
    return message


def test_bad_inputs_give_one_line_config_or_data_errors(tmp_path):
    with pytest.raises(ConfigError) as e:
        build_report([tmp_path / "missing"], tmp_path / "out")
    assert "is not a folder" in one_line(e)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError) as e:
        build_report([tmp_path / "empty"], tmp_path / "out")
    assert "no runs found" in one_line(e)

    run = write_run(tmp_path / "truncated")
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"epoch": 4, "train_lo')
    with pytest.raises(DataError) as e:
        build_report([run], tmp_path / "out")
    assert f"{run / 'metrics.jsonl'} line 4" in one_line(e)

    run = write_run(tmp_path / "badsummary")
    (run / "summary.json").write_text('{\n  "status": "finished",\n  "run": {')
    with pytest.raises(DataError) as e:
        build_report([run], tmp_path / "out")
    assert f"{run / 'summary.json'} line 3 is not JSON" in one_line(e)

    run = write_run(tmp_path / "badtoml")
    (run / "config.toml").write_text("[train\nseed = 0\n")
    with pytest.raises(DataError) as e:
        build_report([run], tmp_path / "out")
    assert "config.toml is not valid TOML" in one_line(e)

    sweep = tmp_path / "badsweep"
    sweep.mkdir()
    (sweep / "manifest.json").write_text('{"version": 1, "runs": [')
    with pytest.raises(DataError) as e:
        build_report([sweep], tmp_path / "out")
    assert "manifest.json" in one_line(e)
    (sweep / "manifest.json").write_text('{"version": 1, "runs": [{"name": "x"}]}')
    with pytest.raises(DataError) as e:
        build_report([sweep], tmp_path / "out")
    assert "not a ddplab sweep manifest" in one_line(e)


def test_report_never_imports_torch(tmp_path):
    sweep = write_sweep(tmp_path)
    code = ("import sys; sys.modules['torch'] = None\n"  # any `import torch` now raises ImportError
            "from pathlib import Path\n"
            "from ddplab.report.build import build_report\n"
            f"build_report([Path({str(sweep)!r})], Path({str(tmp_path / 'out')!r}))\n"
            "assert not [m for m in sys.modules if m.startswith('torch.')], 'torch was imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "index.html").is_file()


def test_report_on_a_real_tiny_run(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "ddplab", "train", "--dataset", "synthetic", "--data.synthetic_size", "128",
           "--data.image_size", "16", "--model.width", "0.5", "--epochs", "2", "--device", "cpu",
           "--output.progress", "false", "--output.tensorboard", "false", "--out", str(run)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = build_report([tmp_path], tmp_path / "out")
    (row,) = read_csv(result["runs_csv"])
    summary = json.loads((run / "summary.json").read_text())
    assert row["status"] == "finished" and float(row["final_test_acc"]) == pytest.approx(summary["final"]["test_acc"])
    assert row["memory_label"] == "peak_rss_mib" and row["epochs"] == "2" and float(row["epoch_s"]) > 0
    assert result["index_html"].read_text().count("data:image/png;base64,") == len(result["plots"]) >= 3


def test_a_one_field_finding_names_the_other_axes_where_they_vary(tmp_path):
    """batch 32 vs 128 at 1 worker and at 2 workers are two findings, each saying which."""
    for name, batch, strategy, nproc, epoch in (("b32-w1", 32, "single", 1, 10.0), ("b128-w1", 128, "single", 1, 5.0),
                                                ("b32-w2", 32, "ddp", 2, 8.0), ("b128-w2", 128, "ddp", 2, 2.0)):
        write_run(tmp_path / "runs" / name, batch=batch, strategy=strategy, nproc=nproc, epoch_s=(epoch, epoch))
    findings = build_report([tmp_path / "runs"], tmp_path / "out")["findings"]
    sentences = sorted(f for f in findings if f.startswith("train.batch_size=32 vs 128"))  # folders sort b128 first
    assert sentences == [
        "train.batch_size=32 vs 128 (strategy=ddp, nproc=2): 4.00x slower, +0.0 points accuracy, single seed: noise not measured",
        "train.batch_size=32 vs 128 (strategy=single, nproc=1): 2.00x slower, +0.0 points accuracy, single seed: noise not measured"]


def write_axis_sweep(sweep: Path, axis: str, variants: list[tuple[str, dict, dict]]) -> Path:
    """A finished one-axis sweep: per variant (label, config sections to update, write_run keywords)."""
    entries = []
    for label, sections, run_kwargs in variants:
        run = write_run(sweep / "runs" / label, **run_kwargs)
        config = tomllib.loads((run / "config.toml").read_text())
        for section, values in sections.items():
            config.setdefault(section, {}).update(values)
        (run / "config.toml").write_text(tomli_w.dumps(config))
        entries.append({"name": label, "dir": f"runs/{label}", "point": {axis: label}, "seed": 0,
                        "status": "finished", "exit_code": 0, "error": None, "wall_s": 1.0})
    (sweep / "manifest.json").write_text(json.dumps({"version": 1, "name": axis, "description": "", "sweep_file": "s.toml",
                                                     "axes": [axis], "repeats": 1, "runs": entries}))
    return sweep


def test_a_variant_axis_is_compared_even_when_it_changes_several_fields(tmp_path):
    """An optimizer variant changes name and lr together: compared along the sweep's axis, against the first value."""
    sweep = write_axis_sweep(tmp_path / "sweep", "optimizer", [
        (label, {"optim": {"name": label, "lr": lr}}, {"epoch_s": (epoch, epoch), "test_acc": acc})
        for label, lr, epoch, acc in (("adam", 0.001, 10.0, 0.70), ("sgd", 0.05, 8.0, 0.73), ("rmsprop", 0.0005, 10.0, 0.65))])
    findings = build_report([sweep], tmp_path / "out")["findings"]
    assert "optimizer=sgd vs adam: 1.25x faster, +3.0 points accuracy, single seed: noise not measured" in findings
    assert "optimizer=rmsprop vs adam: 1.00x faster, -5.0 points accuracy, single seed: noise not measured" in findings
    assert not any(f.startswith("optimizer=rmsprop vs sgd") for f in findings)  # each against the first value only


def test_an_axis_value_is_compared_with_the_axis_first_value_never_with_another_variant(tmp_path):
    """baseline, bn+dropout (two fields), label smoothing (one field): smoothing is said once, against the baseline."""
    sweep = write_axis_sweep(tmp_path / "sweep", "remedy", [
        ("baseline", {"optim": {"label_smoothing": 0.0}}, {}),
        ("bn-dropout", {"model": {"batchnorm": True, "dropout": 0.5}, "optim": {"label_smoothing": 0.0}}, {}),
        ("smoothing", {"optim": {"label_smoothing": 0.1}}, {})])
    findings = build_report([sweep], tmp_path / "out")["findings"]
    compared = [f.split(":")[0] for f in findings if " vs " in f]
    assert compared == ["optim.label_smoothing=0.1 vs 0 (remedy=smoothing)", "remedy=bn-dropout vs baseline"]
