"""`build_report` as a whole (report/build.py): one-line errors for bad folders, never torch, a real run read back."""

import json
import subprocess
import sys

import pytest

from ddplab.errors import ConfigError, DataError
from ddplab.report.build import build_report

from support.reports import read_csv, write_sweep
from support.runs import write_run


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


@pytest.mark.slow(why="a fresh Python process, where torch is made unimportable")
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


@pytest.mark.slow(why="trains a real tiny run, then draws its report")
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
