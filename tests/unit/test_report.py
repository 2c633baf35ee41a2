"""`build_report`: run and sweep folders in; sections with exact tables, findings that never call noise an
effect, PNGs and one offline HTML page out."""

import csv
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from ddplab.config import tomllib  # tomli on Python 3.10
from ddplab.errors import ConfigError, DataError
from ddplab.report import noise
from ddplab.report.build import build_report
from ddplab.report.figures import early_stop_epoch, overfitting
from ddplab.report.runs import group_points, load_runs

from run_folders import epoch_line, write_manifest, write_run

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
            write_run(
                sweep / "runs" / name,
                seed=seed,
                strategy="ddp",
                nproc=2,
                test_acc=acc,
                epoch_s=(8.0, 6.25, 6.25),
                test_loss=(1.0, 0.9, 0.85),
                comm_share=0.1,
                peak_mib=450.0,
            )
        entries.append(
            {
                "name": name,
                "dir": f"runs/{name}",
                "point": {"workers": workers},
                "seed": seed,
                "status": "finished",
                "exit_code": 0,
                "error": None,
                "wall_s": 40.0,
            }
        )
    entries.append(
        {
            "name": "w4-s0",
            "dir": "runs/w4-s0",
            "point": {"workers": "4"},
            "seed": 0,
            "status": "failed",
            "exit_code": 4,
            "error": "training diverged: loss is nan at epoch 2",
            "wall_s": 3.0,
        }
    )
    manifest = {
        "version": 1,
        "name": "scaling",
        "description": "",
        "sweep_file": "scaling.toml",
        "axes": ["workers"],
        "repeats": 2,
        "runs": entries,
    }
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


def numbers(text: str) -> list[str]:
    return re.findall(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?", text)


def section_text(section: dict) -> str:
    cells = [c for _, _, (headers, rows) in section["tables"] for c in [*headers, *(x for r in rows for x in r)]]
    return " ".join([section["setup"], *cells])


def assert_findings_restate_tables(result: dict) -> None:
    """Every number a finding gives is one the section's tables (or its setup line) give, as written there."""
    for section in result["sections"]:
        shown = section_text(section)
        for finding in section["findings"]:
            for number in numbers(finding):
                assert number in shown, f"{number!r} of {finding!r} is in no table of {section['title']!r}"


def test_speed_is_training_throughput_and_speedup_is_against_the_one_worker_point(sweep_report):
    result, _ = sweep_report
    assert (result["num_runs"], result["num_finished"], result["num_points"], result["num_not_finished"]) == (
        5,
        4,
        2,
        1,
    )
    points = {r["point"]: r for r in read_csv(result["points_csv"])}
    one, two = points["workers=1"], points["workers=2"]
    assert one["workers"] == "1" and one["seeds"] == "2" and one["world_size"] == "1" and two["world_size"] == "2"
    assert float(one["final_test_acc"]) == pytest.approx(0.71)
    assert float(one["final_test_acc_std"]) == pytest.approx(0.0141421356)  # sample std of 0.70, 0.72
    assert float(one["images_per_s"]) == pytest.approx(2000 / 18)  # training time only, the first epoch left out
    assert float(two["images_per_s"]) == pytest.approx(2000 / 10.5)
    assert float(two["speedup"]) == pytest.approx(18 / 10.5) and two["baseline"] == "workers=1"
    assert float(two["efficiency"]) == pytest.approx(18 / 10.5)  # on a CPU the ideal is 1x: same cores
    assert one["speedup"] == "" and float(two["comm_wait_share"]) == pytest.approx(0.1)
    assert float(two["peak_mib"]) == 450.0 and two["memory_label"] == "peak_rss_mib" and two["backend"] == "gloo"
    assert one["gap_basis"] == "running, augmented"  # these folders predate eval-mode train accuracy


def test_a_super_linear_speedup_is_flagged_not_stated(sweep_report):
    (section,) = sweep_report[0]["sections"]
    scaling = next(f for f in section["findings"] if f.startswith("workers=2: 1.71x the training throughput"))
    assert (
        "(190 vs 111 images/s), 171% of the ideal 1x; beyond noise (±3%, over seeds; load not recorded for" in scaling
    )
    assert "On a CPU both sides share the same 2 cores" in scaling
    check = next(f for f in section["findings"] if "super-linear" in f)
    assert check.startswith("workers=2 is super-linear (171% of the ideal)") and "likely cause" in check


def test_a_super_linear_speedup_of_single_runs_is_flagged_too(tmp_path):
    """One run each (the seed reports' 283%): no noise to call it an effect, and a 'check' with a cause."""
    write_run(tmp_path / "runs" / "one", epoch_s=(12.0, 10.0, 10.0), other_cpu=0.0, cpu_s=9.0 * 0.5)
    write_run(tmp_path / "runs" / "two", strategy="ddp", nproc=2, epoch_s=(5.0, 3.5, 3.5), other_cpu=0.0)
    findings = build_report([tmp_path / "runs"], tmp_path / "out")["findings"]
    speedup = next(f for f in findings if "the training throughput of" in f)
    assert "single run (one run per side cannot tell an effect from run-to-run noise" in speedup
    check = next(f for f in findings if "super-linear" in f)
    assert "% of the ideal), more than extra hardware can give; likely cause: " in check


def test_findings_restate_the_tables(sweep_report):
    assert_findings_restate_tables(sweep_report[0])


def test_runs_csv_lists_every_run_with_failures_and_their_errors(sweep_report):
    rows = {r["run"]: r for r in read_csv(sweep_report[0]["runs_csv"])}
    assert list(rows) == ["w1-s0", "w1-s1", "w2-s0", "w2-s1", "w4-s0"]
    assert rows["w1-s1"]["point"] == "workers=1" and rows["w1-s1"]["seed"] == "1"
    assert float(rows["w1-s1"]["final_test_acc"]) == pytest.approx(0.72)
    assert float(rows["w2-s0"]["epoch_s"]) == pytest.approx(6.25)
    failed = rows["w4-s0"]
    assert failed["status"] == "failed" and failed["error"] == "training diverged: loss is nan at epoch 2"
    assert failed["final_test_acc"] == ""


def test_markdown_has_the_sections_tables(sweep_report):
    md = sweep_report[0]["report_md"].read_text()
    assert "| workers=1 | 2 | 71.00 ± 1.41 | 91.00 ± 1.41 | +20.0 | 1.000 | 0.800 (2) |" in md
    assert "| workers=2 | workers=1 | 1.71x | 171% (ideal 1x) |" in md
    assert "- w4-s0 (failed): training diverged: loss is nan at epoch 2" in md


def test_html_is_self_contained_with_embedded_pngs(sweep_report):
    result, _ = sweep_report
    page = result["index_html"].read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*https?:""", page, re.I)
    assert "http://" not in page and "https://" not in page and "<script" not in page.lower()
    assert page.count('src="data:image/png;base64,') == len(result["plots"])
    names = {p.name for p in result["plots"]}
    assert names == {
        "s01-curves.png",
        "s01-speed.png",
        "s01-time-breakdown.png",
        "s01-step-loss.png",
        "s01-gpu-utilization.png",
    }  # three epochs: short enough for a per-step curve
    assert "GPU utilization: not measured" not in page and "training diverged" in page
    for path in result["plots"]:
        assert path.read_bytes().startswith(PNG_MAGIC)


def test_text_from_runs_is_escaped_in_html_markdown_and_csv(tmp_path):
    evil, formula = "<img src=x onerror=alert(1)>", "=cmd|calc"
    sweep = write_axis_sweep(tmp_path / "s", "config", [(evil, {}, {}), (formula, {"optim": {"lr": 0.1}}, {})])
    result = build_report([sweep], tmp_path / "out", title="a <script> title")
    page = result["index_html"].read_text()
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page and "<script>" not in page
    md = result["report_md"].read_text()
    assert "<img" not in md and "<script>" not in md and "&lt;img src=x onerror=alert(1)&gt;" in md
    rows = read_csv(result["points_csv"])
    assert [r["point"] for r in rows] == [evil, "'" + formula]  # a formula stays text in a spreadsheet


def test_runs_differing_only_in_seed_and_output_form_one_point(tmp_path):
    write_run(tmp_path / "a", seed=0, test_acc=0.70)
    write_run(tmp_path / "b", seed=1, test_acc=0.72)
    write_run(tmp_path / "c", seed=0, batch=64)
    points = group_points(load_runs([tmp_path]))
    assert [(p.label, len(p.runs)) for p in points] == [("batch_size=32", 2), ("batch_size=64", 1)]
    assert points[0].axes == {"train.batch_size": 32}


def precision_runs(root: Path, bf16_epoch: float, spread: float, other_cpu=None) -> Path:
    """fp32 and bf16, two seeds each; bf16's epochs take `bf16_epoch` s (train_s 1 s less), seeds apart by
    `spread` s."""
    for name, precision, seed, acc, epoch in (
        ("a0", "fp32", 0, 0.70, 10.0),
        ("a1", "fp32", 1, 0.72, 10.0 + spread),
        ("b0", "bf16", 0, 0.69, bf16_epoch),
        ("b1", "bf16", 1, 0.71, bf16_epoch + spread),
    ):
        write_run(
            root / name,
            precision=precision,
            seed=seed,
            test_acc=acc,
            epoch_s=(epoch, epoch),
            train_loss=(1.0, 0.9),
            test_loss=(1.0, 0.95),
            other_cpu=0.0 if other_cpu is None or name != "b1" else other_cpu,
        )
    return root


def test_a_timing_difference_beyond_noise_is_an_effect(tmp_path):
    result = build_report([precision_runs(tmp_path / "runs", bf16_epoch=8.0, spread=0.0)], tmp_path / "out")
    (finding,) = [f for f in result["findings"] if f.startswith("precision=bf16 vs precision=fp32")]
    assert finding == (
        "precision=bf16 vs precision=fp32: 1.29x faster (143 vs 111 training images/s, beyond noise "
        "(±3%, over seeds)); test accuracy 70.00% vs 71.00% (-1.0 points, within noise (noise 1.4 "
        "points, std over seeds))"
    )
    assert_findings_restate_tables(result)


def test_a_timing_difference_within_the_seeds_spread_is_not_an_effect(tmp_path):
    """bf16 2% faster, but the seeds of each point are 5% apart: noise, said so."""
    result = build_report([precision_runs(tmp_path / "runs", bf16_epoch=9.8, spread=0.5)], tmp_path / "out")
    (finding,) = [f for f in result["findings"] if f.startswith("precision=bf16 vs precision=fp32")]
    assert finding.startswith("precision=bf16 vs precision=fp32: within noise: 1.02x faster (")
    assert "beyond noise" not in finding.split("test accuracy")[0]


def test_a_comparison_with_a_contended_run_is_unreliable_whatever_the_numbers(tmp_path):
    result = build_report(
        [precision_runs(tmp_path / "runs", bf16_epoch=5.0, spread=0.0, other_cpu=0.35)], tmp_path / "out"
    )
    (finding,) = [f for f in result["findings"] if f.startswith("precision=bf16 vs precision=fp32")]
    assert finding.startswith(
        "precision=bf16 vs precision=fp32: unreliable: 2.25x faster (250 vs 111 training images/s; "
        "the clocks measured other work; b1: other processes used up to 35% of the CPUs)"
    )
    assert "beyond noise (±" not in finding
    page = result["index_html"].read_text()
    assert '<li class="unreliable">precision=bf16 vs precision=fp32' in page and "35% CPU (contended)" in page
    assert_findings_restate_tables(result)


def test_accuracy_noise_is_the_seeds_spread_or_the_test_sets_own():
    a = {"final_test_acc": 0.70, "final_test_acc_std": None, "test_images": 10_000}
    b = {"final_test_acc": 0.73, "final_test_acc_std": None, "test_images": 10_000}
    verdict = noise.accuracy_verdict(
        0.03, b, a
    )  # sampling noise, the larger side's: sqrt(.7 * .3 / 10000) = 0.46 points
    assert verdict.text() == (
        "single seed (beyond the test set's sampling noise of 0.5 points; the spread over seeds "
        "is not measured: set sweep.repeats)"
    )
    small = {**a, "test_images": 200}  # sqrt(.7 * .3 / 200) = 3.2 points: 3 points is within it
    assert noise.accuracy_verdict(0.03, {**b, "test_images": 200}, small).word == "within noise"
    seeds = {**a, "final_test_acc_std": 0.02}
    assert (
        noise.accuracy_verdict(0.03, {**b, "final_test_acc_std": 0.01}, seeds).text()
        == "within noise (noise 2.0 points, std over seeds)"
    )


def test_timing_noise_of_one_run_is_its_windows_standard_error():
    steps = [
        {"epoch": 2, "step": s, "t_s": t}
        for s, t in ((0, 0.0), (1, 1.0), (2, 2.1), (3, 3.0), (4, 4.1), (5, 5.0), (6, 6.1))
    ]
    rates = noise.window_rates(steps, images_per_step=100, epochs=2)
    assert rates == pytest.approx([100.0, 100 / 1.1, 100 / 0.9, 100 / 1.1, 100 / 0.9, 100 / 1.1])
    assert noise.within_run_noise(rates) == pytest.approx(statistics.stdev(rates) / statistics.fmean(rates) / 6**0.5)
    assert noise.within_run_noise(rates[:4]) is None  # too few windows to say
    one = noise.point_timing([100.0], [0.02])
    assert (one.noise, one.basis) == (0.02, "within-run")
    two = noise.point_timing([100.0, 110.0], [0.01, 0.01])
    assert two.basis == "seeds" and two.noise == pytest.approx(7.0711 / 105, rel=1e-4)
    quiet = {"a": noise.Load(0.0, 0.0, None)}
    # One run per side: a run's own spread says nothing of the next run's, however large the ratio.
    for ratio in (1.05, 3.0):
        assert noise.timing_verdict(ratio, one, one, quiet).text() == (
            "single run (one run per side cannot tell an effect from run-to-run noise: set sweep.repeats)"
        )
    assert noise.timing_verdict(3.0, two, one, quiet).word == "single run"
    steady = noise.Timing(100.0, 0.005, "seeds")  # 2 x hypot(0.5%, 0.5%) = 1.4%: the 3% floor applies
    assert noise.timing_verdict(1.02, steady, steady, quiet).text() == "within noise (±3%, over seeds)"
    assert noise.timing_verdict(1.04, steady, steady, quiet).word == "beyond noise"


def test_overfitting_needs_test_loss_up_10_percent_while_train_loss_falls():
    def curve(train, test):
        return [
            {"epoch": i, "train_loss": a, "test_loss": b, "test_acc": 0.5 + i / 100}
            for i, (a, b) in enumerate(zip(train, test), 1)
        ]

    found = overfitting(curve([1.0, 0.8, 0.6, 0.4], [1.0, 0.5, 0.6, 0.7]))
    assert (found.overfits, found.min_epoch, found.rise) == (True, 2, pytest.approx(0.4))
    assert (found.stop_epoch, found.stop_test_acc) == (4, 0.54)  # patience 2: epochs 3 and 4 did not improve
    assert not overfitting(curve([1.0, 0.8, 0.6, 0.4], [1.0, 0.5, 0.52, 0.55])).overfits  # +10% exactly: not beyond
    assert not overfitting(curve([1.0, 0.5, 0.6, 0.7], [1.0, 0.5, 0.6, 0.7])).overfits  # train loss rises too
    assert overfitting(curve([1.0], [1.0])) is None
    assert early_stop_epoch([{"epoch": i, "test_loss": v} for i, v in enumerate([3, 2, 1], 1)], 2) is None


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
    assert "manifest.json lacks runs[0].dir, which ddplab always writes" in one_line(e)
    for outside in ("../../elsewhere", str(tmp_path / "badtoml")):  # the manifest is data: stay inside the sweep
        (sweep / "manifest.json").write_text(json.dumps({"version": 2, "runs": [{"name": "x", "dir": outside}]}))
        with pytest.raises(DataError) as e:
            build_report([sweep], tmp_path / "out")
        assert f"runs[0].dir is {outside!r}, outside the sweep's runs/" in one_line(e)


def test_a_folder_linking_to_itself_is_read_once(tmp_path):
    write_run(tmp_path / "runs" / "a")
    (tmp_path / "runs" / "latest").symlink_to(".")
    assert [r.name for r in load_runs([tmp_path / "runs"])] == ["a"]


@pytest.mark.slow
def test_report_never_imports_torch(tmp_path):
    sweep = write_sweep(tmp_path)
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any `import torch` now raises ImportError
        "from pathlib import Path\n"
        "from ddplab.report.build import build_report\n"
        f"build_report([Path({str(sweep)!r})], Path({str(tmp_path / 'out')!r}))\n"
        "assert not [m for m in sys.modules if m.startswith('torch.')], 'torch was imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "index.html").is_file()


@pytest.mark.slow
def test_report_on_a_real_tiny_run(tmp_path):
    run = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "ddplab",
        "train",
        "--dataset",
        "synthetic",
        "--data.synthetic_size",
        "128",
        "--data.image_size",
        "16",
        "--model.width",
        "0.5",
        "--epochs",
        "2",
        "--device",
        "cpu",
        "--output.progress",
        "false",
        "--output.tensorboard",
        "false",
        "--out",
        str(run),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == f"  run folder    {run}"
    result = build_report([tmp_path], tmp_path / "out")
    (row,) = read_csv(result["runs_csv"])
    summary = json.loads((run / "summary.json").read_text())
    assert row["status"] == "finished" and float(row["final_test_acc"]) == pytest.approx(summary["final"]["test_acc"])
    assert float(row["train_eval_acc"]) == pytest.approx(summary["final"]["train_eval_acc"])
    assert row["gap_basis"] == "eval mode" and row["memory_label"] == "peak_rss_mib" and row["epochs"] == "2"
    assert float(row["other_cpu"]) >= 0 and row["torch"] and row["device_name"].startswith("CPU")
    assert result["index_html"].read_text().count("data:image/png;base64,") == len(result["plots"]) >= 2


def write_axis_sweep(sweep: Path, axis: str, variants: list[tuple[str, dict, dict]], version=1, sections=None) -> Path:
    """A finished one-axis sweep: per variant (label, config sections to update, write_run keywords)."""
    runs = []
    for label, sections_, run_kwargs in variants:
        run = write_run(sweep / "runs" / label, **run_kwargs)
        config = tomllib.loads((run / "config.toml").read_text())
        for section, values in sections_.items():
            config.setdefault(section, {}).update(values)
        (run / "config.toml").write_text(tomli_w.dumps(config))
        runs.append({"name": label, "point": {axis: label}, "seed": 0})
    return write_manifest(sweep, runs, axes=[axis], sections=sections, name=sweep.name, version=version)


def test_a_variant_axis_is_compared_against_its_first_value(tmp_path):
    """An optimizer variant changes name and lr together: compared along the sweep's axis, against the first value."""
    sweep = write_axis_sweep(
        tmp_path / "sweep",
        "optimizer",
        [
            (label, {"optim": {"name": label, "lr": lr}}, {"epoch_s": (epoch, epoch), "test_acc": acc})
            for label, lr, epoch, acc in (
                ("adam", 0.001, 10.0, 0.70),
                ("sgd", 0.05, 8.0, 0.73),
                ("rmsprop", 0.0005, 10.0, 0.65),
            )
        ],
    )
    findings = build_report([sweep], tmp_path / "out")["findings"]
    compared = [f.split(":")[0] for f in findings if " vs " in f.split(":")[0]]
    assert compared == ["sgd vs adam", "rmsprop vs adam"]  # each against the first value only
    sgd = next(f for f in findings if f.startswith("sgd vs adam"))
    assert sgd.startswith(
        "sgd vs adam: single run: 1.29x faster (143 vs 111 training images/s; one run per side "
        "cannot tell an effect from run-to-run noise: set sweep.repeats); test accuracy 73.00% vs "
        "70.00% (+3.0 points, single seed (beyond the test set's sampling noise of 0.5 points; the "
        "spread over seeds is not measured: set sweep.repeats))"
    )
    assert next(f for f in findings if f.startswith("best test accuracy")).startswith(
        "best test accuracy: sgd, 73.00%; ahead of adam"
    )


@pytest.mark.slow
def test_two_sweeps_make_two_sections_and_nothing_is_compared_across(tmp_path):
    first = write_axis_sweep(
        tmp_path / "optimizers",
        "optimizer",
        [("adam", {"optim": {"name": "adam"}}, {}), ("sgd", {"optim": {"name": "sgd"}}, {"test_acc": 0.75})],
    )
    second = write_axis_sweep(
        tmp_path / "precision",
        "precision",
        [("fp32", {}, {}), ("bf16", {}, {"precision": "bf16", "epoch_s": (5.0, 5.0, 5.0)})],
    )
    result = build_report([first, second], tmp_path / "out")
    titles = [s["title"] for s in result["sections"]]
    assert titles == ["optimizers sweep", "precision sweep"]
    mine = {s["title"]: " ".join(s["findings"]) for s in result["sections"]}
    assert "fp32" not in mine["optimizers sweep"] and "adam" not in mine["precision sweep"]
    assert "bf16 vs fp32" in mine["precision sweep"] and "sgd vs adam" in mine["optimizers sweep"]
    page = result["index_html"].read_text()
    assert page.count("<section id=") == 2 and '<a href="#1-optimizers-sweep">' in page


SECTIONS = [
    {
        "title": "Q2. Scaling",
        "question": "Does DDP pay?",
        "kind": "scaling",
        "note": "Background.",
        "runs": ["one", "ddp", "dp"],
        "baseline_runs": ["one"],
        "not_measured": [{"point": "nccl", "reason": "NCCL needs CUDA GPUs"}],
    },
    {
        "title": "Q3. Overfitting",
        "kind": "overfitting",
        "runs": ["one", "ddp"],
        "baseline_runs": ["one"],
        "not_measured": [],
    },
    {
        "title": "Q5. Remedies",
        "kind": "regularization",
        "runs": ["one", "aug"],
        "baseline_runs": ["one"],
        "not_measured": [],
    },
]


def write_sectioned_sweep(sweep: Path) -> Path:
    losses = {"one": (1.0, 0.7, 0.9, 1.2, 1.3), "ddp": (1.0, 0.7, 0.9, 1.2, 1.3), "aug": (1.0, 0.8, 0.75, 0.74, 0.74)}
    for name, kwargs in (
        ("one", {}),
        ("ddp", {"strategy": "ddp", "nproc": 2, "batch": 16}),
        ("aug", {"config": {"data": {"crop_padding": 4}}, "test_acc": 0.78}),
    ):
        write_run(
            sweep / "runs" / name,
            epoch_s=(3.0,) * 5,
            train_loss=(1.2, 0.9, 0.6, 0.3, 0.2),
            test_loss=losses[name],
            train_eval_acc=0.95 if name != "aug" else 0.80,
            other_cpu=0.01,
            cpu_s=4.0,
            **kwargs,
        )
    runs = [{"name": n, "point": {"config": n}, "seed": 0} for n in ("one", "ddp", "aug")]
    runs.append(
        {
            "name": "dp",
            "point": {"config": "dp x2"},
            "seed": 0,
            "status": "skipped",
            "error": "not run on this machine: DataParallel needs CUDA devices",
        }
    )
    return write_manifest(sweep, runs, sections=SECTIONS)


@pytest.mark.slow
def test_a_sweeps_sections_answer_their_questions(tmp_path):
    result = build_report([write_sectioned_sweep(tmp_path / "study")], tmp_path / "out")
    scaling, over, remedies = result["sections"]
    assert [s["title"] for s in result["sections"]] == ["Q2. Scaling", "Q3. Overfitting", "Q5. Remedies"]
    assert scaling["findings"][0].startswith(
        "ddp: 1.00x the training throughput of one (500 vs 500 images/s), 100% of the ideal 1x"
    )
    assert "(the same global batch of 32: the same optimizer steps)" in scaling["findings"][0]
    assert scaling["findings"][-2:] == [
        "not measured here: nccl: NCCL needs CUDA GPUs",
        "not measured here: dp x2: not run on this machine: DataParallel needs CUDA devices",
    ]
    assert over["findings"][0] == (
        "one overfits: its test loss was lowest at epoch 2 (0.700) and ends +86% above it (1.300 at epoch 5) while the "
        "training loss on training images in eval mode kept falling; train accuracy 95.00% (training images in eval "
        "mode) vs test 70.00%, a gap of +25.0 points. Early stopping on test loss (patience 2) would have stopped "
        "after epoch 4, at 70.00% test accuracy (the same run, cut short)"
    )
    assert remedies["findings"][0].startswith("aug vs one: single run: 1.00x faster (500 vs 500 training images/s; ")
    assert (
        "test loss +0% from its lowest at the end (one: +86%), train-test gap +2.0 vs +25.0 points"
        in remedies["findings"][0]
    )
    assert remedies["findings"][1].startswith("one overfits")  # the baseline, for reference
    for s in result["sections"]:
        assert "Speed" in [t[0] for t in s["tables"]]
    assert "Overfitting" in [t[0] for t in over["tables"]] and "Scaling" in [t[0] for t in scaling["tables"]]
    assert scaling["setup"] == (
        "simple_cnn (1,000 parameters, 2.0 MFLOP/image); synthetic: 1,000 training / 10,000 "
        "test images; 5 epochs; adam lr 0.001 (schedule none); on CPU Test (2 CPUs), torch 2.13.0"
    )
    assert_findings_restate_tables(result)
    page = result["index_html"].read_text()
    assert "<blockquote>Does DDP pay?</blockquote>" in page and "Background." in page


@pytest.mark.slow
def test_plots_name_every_point_in_full_and_never_crowd_a_panel(tmp_path):
    long = "batchnorm + dropout 0.5 in the head, with weight decay 5e-4 and label smoothing 0.1"
    variants = [
        (long if i == 0 else f"variant {i}", {"optim": {"lr": 0.001 * (i + 1)}}, {"test_acc": 0.6 + i / 100})
        for i in range(6)
    ]
    few = build_report([write_axis_sweep(tmp_path / "few", "config", variants[:3])], tmp_path / "few-out")
    (curves,) = [p for p in few["sections"][0]["plots"] if p.name == "curves"]
    assert curves.legend == [long, "variant 1", "variant 2"] and curves.max_lines == 6  # 3 points x train, test
    many = build_report([write_axis_sweep(tmp_path / "many", "config", variants)], tmp_path / "many-out")
    for plot in many["sections"][0]["plots"]:
        assert plot.max_lines <= 8 and all("…" not in entry for entry in plot.legend)
    for plot in few["sections"][0]["plots"] + many["sections"][0]["plots"]:
        assert not plot.clipped, (plot.name, plot.clipped)  # every legend inside its figure
    (curves,) = [p for p in many["sections"][0]["plots"] if p.name == "curves"]
    assert curves.max_lines == 2  # six points: one panel each


def test_labels_are_text_not_mathtext(tmp_path):
    sweep = write_axis_sweep(
        tmp_path / "s", "config", [("cost $\\notacommand$", {}, {}), ("b", {"optim": {"lr": 0.1}}, {})]
    )
    assert build_report([sweep], tmp_path / "out")["index_html"].is_file()


def test_a_sweep_with_a_measured_link_shows_the_predicted_speedup_beside_the_measured(tmp_path):
    """links.json in the sweep folder (the sweep runner measures it): each scaling pair gets the model's speedup,
    predicted from the 1-worker run. By hand: 1 worker, 32 images a step: (7.2 + 0.9) ms an image, 28.125 ms of
    optimizer a step; 2 processes on the same cores: twice that, plus one 10.004 ms all-reduce, 16 steps an epoch
    against 32: 9.1944 s / (16 x 0.584654 s) = 0.98x."""
    sweep = write_sweep(tmp_path)
    write_link(sweep)
    result = build_report([sweep], tmp_path / "out")
    md = result["report_md"].read_text()
    header = next(line for line in md.splitlines() if line.startswith("| point | vs | speedup | of ideal | predicted"))
    row = next(line for line in md.splitlines() if line.startswith("| workers=2 | workers=1 | 1.71x |"))
    assert header and row.split(" | ")[4] == "0.98x"  # measured 1.71x: the fixture's 2-worker runs are faster
    assert (
        "The scaling model (ddplab plan) predicted 0.98x from workers=1 over this machine's measured link; "
        "the measured 1.71x is above it"
    ) in md
    without = build_report([write_sweep(tmp_path / "plain")], tmp_path / "out2")["report_md"].read_text()
    assert "predicted" not in without  # no link measured: no column, no claim


def write_link(sweep: Path) -> None:
    """links.json as the sweep runner writes it: a 2-rank measurement that fits 10 ms + 1 GB/s exactly."""
    from ddplab.planner.links import SIZES, Link

    link = Link("x", busbw_gbps=1.0, alpha_s=0.01, source="test")
    sizes = list(SIZES[:5])
    (sweep / "links.json").write_text(
        json.dumps(
            {
                "measurement": {
                    "backend": "gloo",
                    "ranks": 2,
                    "device": "cpu",
                    "sizes": sizes,
                    "times_s": [link.allreduce_s(s, 2) for s in sizes],
                }
            }
        )
    )


def test_the_models_curves_run_through_the_measured_points(tmp_path):
    """Batch 32 and 64 x 1 and 2 workers, a measured link: the model planned from the batch-32 1-worker run.
    By hand (the fixture: 9 s training epochs of 1000 images, 10% data, 80% compute, 10% optimizer, 32 steps):
    one worker at its own batch, 32 x (32 x 8.1 ms + 28.125 ms) = 9.1944 s (its last batch is 8 images, the
    model's per-image costs count a full one); at batch 64, 16 x (64 x 8.1 + 28.125) = 8.7444 s. Speedup at
    2 workers from the batch-32 run: 0.98x (as the scaling table); the curve reaches 4 and 8 workers, its
    ideal 1x throughout (one CPU)."""
    from ddplab.report.figures import run_row
    from ddplab.report.sections import build_sections

    sweep = tmp_path / "sweep"
    entries = []
    for batch in (32, 64):
        for workers in (1, 2):
            name = f"b{batch}-w{workers}"
            write_run(
                sweep / "runs" / name,
                batch=batch,
                strategy="ddp" if workers > 1 else "single",
                nproc=workers,
                epoch_s=(12.0, 10.0, 10.0) if workers == 1 else (9.0, 7.0, 7.0),
                comm_share=0.1 * (workers > 1),
            )
            entries.append(
                {"name": name, "point": {"batch": str(batch), "workers": str(workers), "lr": "0.001"}, "seed": 0}
            )
    # another recipe (a higher lr) at batch 64: its own 1-worker point, never drawn on the batch-32 run's curves
    write_run(sweep / "runs" / "lr", batch=64, config={"optim": {"lr": 0.01}}, epoch_s=(12.0, 2.0, 2.0))
    entries.append({"name": "lr", "point": {"batch": "64", "workers": "1", "lr": "0.01"}, "seed": 0})
    write_manifest(sweep, entries, axes=["batch", "workers", "lr"])
    write_link(sweep)
    runs = load_runs([sweep])
    (section,) = build_sections(runs, {r.name: run_row(r) for r in runs})
    curves = section.model_curves
    assert curves.source == "batch=32, workers=1, lr=0.001"
    low, high = curves.workers
    assert (low.label, low.x, low.ideal) == ("from batch=32, workers=1, lr=0.001", [1, 2, 4, 8], [1.0] * 4)
    assert low.predicted[0] == pytest.approx(1.0) and round(low.predicted[1], 2) == 0.98
    assert low.measured == [(2, pytest.approx(9 / 6))] and high.label == "from batch=64, workers=1, lr=0.001"
    one, two = curves.batch
    assert (one.label, one.x, two.label) == ("1 worker", [32, 64], "2 workers")
    assert one.predicted == [pytest.approx(9.1944), pytest.approx(8.7444)]
    assert one.measured == [(32, pytest.approx(9.0)), (64, pytest.approx(9.0))]
    assert [x for x, _ in two.measured] == [32, 64]
    result = build_report([sweep], tmp_path / "out")
    (plot,) = [p for p in result["sections"][0]["plots"] if p.name == "predicted"]
    assert plot.path.is_file() and not plot.clipped
    assert "from batch=32, workers=1, lr=0.001: predicted" in plot.legend and "2 workers: measured" in plot.legend


def test_a_scaling_point_short_of_the_ideal_says_where_its_epoch_went(tmp_path):
    """2 workers at 11 s a training epoch against 9 s for one (the ideal on one CPU node: 1x, so 9 s). By cause,
    from DDP's timers: the all-reduce exposed on the rank that waited least (rank 1) 12 - 2 = 10 ms a step, x 16
    steps (1000 images at a global batch of 64) = +0.16 s an epoch; rank 0's 30 - 5 = 25 ms, so it waited 15 ms
    a step for rank 1: stragglers +0.24 s; compute 80% x 11 - 80% x 9 less both = +1.20 s; optimizer and data
    10% x (11 - 9) = +0.20 s each, nothing else. The probe saw 1.1 s / 16 = 68.75 ms a step against DDP's
    10 ms: they disagree, and the epoch is taken apart with DDP's. Without DDP's timers the probe's 10% is the
    all-reduce wait (+1.10 s) and compute +0.50 s."""
    sweep = tmp_path / "sweep"
    write_run(sweep / "runs" / "one", epoch_s=(12.0, 10.0, 10.0))
    write_run(
        sweep / "runs" / "two",
        strategy="ddp",
        nproc=2,
        epoch_s=(14.0, 12.0, 12.0),
        comm_share=0.1,
        ddp={"comm": [0.030, 0.012], "overlap": [0.005, 0.002]},
    )
    write_manifest(
        sweep,
        [{"name": "one", "point": {"workers": "1"}, "seed": 0}, {"name": "two", "point": {"workers": "2"}, "seed": 0}],
        axes=["workers"],
    )
    result = build_report([sweep], tmp_path / "out")
    md = result["report_md"].read_text()
    assert (
        "Why it falls short of the ideal: 11.00 s a training epoch against an ideal 9.00 s; compute +1.20 s, "
        "all-reduce wait +0.16 s, stragglers +0.24 s, optimizer +0.20 s, data +0.20 s, the rest of the step "
        "+0.00 s; the most: compute (the processes share the machine's cores)"
    ) in md
    assert (
        "| workers=2 | workers=1 | 11.00 | 9.00 | +1.20 | +0.16 | +0.24 | +0.20 | +0.20 | +0.00 | compute |" in md
    )  # the findings' figures are the table's cells
    assert (
        "The all-reduce per step: ddplab's probe 68.75 ms of wait, DDP's own timers 10.00 ms exposed on the rank "
        "that waited least (12.00 ms from the first bucket's launch to the last one's end): they disagree"
    ) in md
    assert "rank 0 waited 15.00 ms a step for the slowest rank" in md
    assert "| workers=2 | 68.75 | 10.00 | 12.00 | 15.00 |" in md
    assert_findings_restate_tables(result)
    # without DDP's timings (a torch without them, or a folder from before): the stragglers are not measured
    write_run(sweep / "runs" / "old", strategy="ddp", nproc=2, epoch_s=(14.0, 12.0, 12.0), comm_share=0.1)
    write_manifest(
        sweep,
        [{"name": "one", "point": {"workers": "1"}, "seed": 0}, {"name": "old", "point": {"workers": "2"}, "seed": 0}],
        axes=["workers"],
    )
    md = build_report([sweep], tmp_path / "out-old")["report_md"].read_text()
    assert "compute +0.50 s, all-reduce wait +1.10 s, stragglers not measured, optimizer +0.20 s" in md
    assert "| +0.50 | +1.10 | - | +0.20 |" in md and "measured two ways" not in md
    assert (
        "Why it falls short"
        not in build_report([write_sweep(tmp_path / "fast")], tmp_path / "o2")["report_md"].read_text()
    )


def test_an_all_reduce_wait_across_nodes_names_the_link_it_crosses():
    from ddplab.report.figures import link_text, why

    shaped = {"interface": "eth0", "address": "10.211.0.1", "speed_mbit": 10000, "shaped_mbit": 100.0}
    assert link_text(shaped) == "eth0, shaped to 100 Mbit/s"
    assert link_text({**shaped, "shaped_mbit": None}) == "eth0, 10,000 Mbit/s"
    assert link_text({"interface": "ib0", "speed_mbit": None, "shaped_mbit": None}) == "ib0"
    assert link_text(None) is None and link_text({"interface": 3}) is None  # an env.json without it, or edited
    base = {"local_batch": 32, "nodes": 1}
    assert why("all-reduce wait", {"nodes": 2, "link": link_text(shaped), "local_batch": 32}, base) == (
        "the gradients' all-reduce crosses the link between the 2 nodes (eth0, shaped to 100 Mbit/s) and backward "
        "does not hide it"
    )
    assert why("all-reduce wait", {"nodes": 3, "link": None}, base) == (
        "the gradients' all-reduce crosses the link between the 3 nodes and backward does not hide it"
    )
    assert (
        why("all-reduce wait", {"nodes": 1, "link": None}, base)
        == "the gradients' all-reduce is not hidden behind backward"
    )


def write_sized_down_sweep(
    sweep: Path,
    schedule: str = "none",
    adapted_here: bool = True,
    values: tuple = ("fp32", "bf16"),
    named: str = "bf16",
) -> Path:
    """fp32 for 3 epochs and bf16 sized down to 2 (an [adapt] table did it), two seeds each; fp32's test
    accuracy climbs 30, 40, 60% (seed 1: +2 points), bf16 ends at 41 and 43%."""
    runs = []
    for seed in (0, 1):
        fp32 = write_run(
            sweep / "runs" / f"fp32_s{seed}",
            seed=seed,
            epoch_s=(12.0, 10.0, 10.0),
            steps=True,
            config={"optim": {"schedule": schedule}},
        )
        lines = [json.loads(line) for line in (fp32 / "metrics.jsonl").read_text().splitlines()]
        for record, acc in zip(lines, (0.30, 0.40, 0.60)):
            record["test_acc"] = acc + 0.02 * seed
        (fp32 / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        summary = json.loads((fp32 / "summary.json").read_text())
        summary["final"]["test_acc"] = summary["best"]["test_acc"] = 0.60 + 0.02 * seed
        (fp32 / "summary.json").write_text(json.dumps(summary))
        write_run(
            sweep / "runs" / f"bf16_s{seed}",
            seed=seed,
            precision="bf16",
            epoch_s=(60.0, 50.0),
            steps=True,
            test_acc=0.41 + 0.02 * seed,
            config={"optim": {"schedule": schedule}},
        )
        runs += [
            {"name": f"fp32_s{seed}", "point": {"config": values[0]}, "seed": seed},
            {"name": f"bf16_s{seed}", "point": {"config": values[1]}, "seed": seed},
        ]
    adapted = "this CPU (Test) does not compute bf16 natively: so bf16 with train.epochs=2 (the others: 3)"
    sections = [
        {
            "title": "Precision",
            "kind": "compare",
            "runs": [r["name"] for r in runs],
            "baseline_runs": ["fp32_s0", "fp32_s1"],
            "not_measured": [],
            "adapted": [adapted],
            "adapted_points": [named] if adapted_here else [],
        }
    ]
    return write_manifest(sweep, runs, sections=sections)


def test_a_point_sized_down_for_this_machine_is_compared_at_equal_epochs(tmp_path):
    """bf16 trained 2 epochs where fp32 trained 3: with a schedule not planned over the run, fp32's first 2
    epochs are what a 2-epoch fp32 run would have trained, seed for seed, so bf16 is set against them (speed
    from their timed epochs, accuracy at epoch 2), and the setup line says what was adapted."""
    from ddplab.report.figures import run_row
    from ddplab.report.sections import build_sections, setup_text

    runs = load_runs([write_sized_down_sweep(tmp_path / "sweep")])
    (section,) = build_sections(runs, {r.name: run_row(r) for r in runs})
    (pair,) = section.pairs
    assert pair.baseline == "fp32, its first 2 epochs" and pair.equal_epochs
    assert pair.base["final_test_acc"] == pytest.approx(0.41) and pair.acc_diff == pytest.approx(0.01)
    assert pair.speedup == pytest.approx(9.0 / 49.0)  # epoch 2 alone is timed on both sides
    assert setup_text(section).endswith(
        "; adapted to this machine: this CPU (Test) does not compute bf16 natively: "
        "so bf16 with train.epochs=2 (the others: 3)"
    )
    # A schedule planned over the run (onecycle): fp32's first 2 epochs are not a 2-epoch run; compared as they are.
    runs = load_runs([write_sized_down_sweep(tmp_path / "onecycle", schedule="onecycle")])
    (section,) = build_sections(runs, {r.name: run_row(r) for r in runs})
    (pair,) = section.pairs
    assert pair.baseline == "fp32" and not pair.equal_epochs and pair.acc_diff == pytest.approx(-0.19)
    # A point that asks for fewer epochs itself (not sized down for this machine) is compared as it is.
    runs = load_runs([write_sized_down_sweep(tmp_path / "asked", adapted_here=False)])
    (section,) = build_sections(runs, {r.name: run_row(r) for r in runs})
    assert not section.pairs[0].equal_epochs and section.pairs[0].acc_diff == pytest.approx(-0.19)
    # An axis of true/false: the sweep names the point "true" (spec.point_text), as the report must read it.
    runs = load_runs([write_sized_down_sweep(tmp_path / "flag", values=(False, True), named="true")])
    (section,) = build_sections(runs, {r.name: run_row(r) for r in runs})
    assert section.pairs[0].equal_epochs and section.pairs[0].acc_diff == pytest.approx(0.01)


def test_a_plot_is_whole_or_absent(tmp_path, monkeypatch):
    """A full disk while a PNG is written: one FileSystemError naming it, nothing under its name, no temp file."""
    import errno

    import matplotlib.pyplot as plt

    from ddplab.errors import FileSystemError
    from ddplab.report import plots

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    real = type(fig).savefig

    def full_disk(self, path, **kwargs):
        real(self, path, **kwargs)  # the bytes land, then the disk fills (as a close that fails would)
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(type(fig), "savefig", full_disk)
    with pytest.raises(FileSystemError, match="No space left on device"):
        plots.save(fig, tmp_path / "loss.png", "a curve")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    fig, ax = plt.subplots()
    plot = plots.save(fig, tmp_path / "loss.png", "a curve")
    assert plot.path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and list(tmp_path.iterdir()) == [tmp_path / "loss.png"]


def test_a_sweep_file_may_name_exactly_the_section_kinds_the_report_has():
    """spec.KINDS (what a sweep file may say) and report/kinds.py (what the report does with each) name the same
    kinds."""
    from ddplab.report.kinds import KINDS
    from ddplab.sweep.spec import KINDS as NAMES

    assert set(NAMES) == set(KINDS) and NAMES[0] == "all"
