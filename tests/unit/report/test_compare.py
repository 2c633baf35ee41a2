"""`ddplab compare`: the report's figures for runs picked by hand, scaled against the one with the fewest workers."""

import csv

import pytest

from ddplab.cli import main
from ddplab.report.build import build_report
from ddplab.report.compare import format_rows, scaling_rows
from ddplab.rundir.runread import finished_run

from support.runs import epoch_line, write_run


def test_speedup_and_efficiency_against_the_fewest_workers(tmp_path):
    """Speedup on training throughput (epochs after the first; train_s = epoch_s - 1 here); on GPUs the ideal is
    the GPU count."""
    one = write_run(tmp_path / "one", epoch_s=(12.0, 10.0, 10.0), device="cuda:0")
    four = write_run(
        tmp_path / "four",
        strategy="ddp",
        nproc=4,
        epoch_s=(8.0, 4.0, 4.0),
        comm_share=0.1,
        test_acc=0.69,
        device="cuda:0",
    )
    rows = {r["run"]: r for r in scaling_rows([finished_run(four), finished_run(one)])}
    assert rows["one"]["images_per_s"] == pytest.approx(2000 / 18)
    assert rows["four"]["speedup"] == pytest.approx(3.0) and rows["four"]["efficiency"] == pytest.approx(0.75)
    assert rows["four"]["comm_wait_share"] == pytest.approx(0.1) and rows["four"]["data_share"] == pytest.approx(0.1)
    assert rows["one"]["speedup"] is None and rows["one"]["is_baseline"] and rows["four"]["global_batch"] == 128
    assert rows["four"]["baseline"] == "one" and rows["four"]["final_test_acc"] == 0.69


def test_on_a_cpu_workers_share_the_cores_so_the_ideal_is_1x(tmp_path):
    one = write_run(tmp_path / "one", epoch_s=(12.0, 10.0, 10.0))
    two = write_run(tmp_path / "two", strategy="ddp", nproc=2, epoch_s=(12.0, 8.2, 8.2))
    rows = {r["run"]: r for r in scaling_rows([finished_run(one), finished_run(two)])}
    assert rows["two"]["ideal"] == 1 and rows["two"]["efficiency"] == pytest.approx(
        rows["two"]["speedup"]
    ) == pytest.approx(1.25)


def test_without_a_one_worker_run_efficiency_is_against_the_smallest_world(tmp_path):
    two = write_run(tmp_path / "two", strategy="ddp", nproc=2, epoch_s=(6.0, 5.0, 5.0), device="cuda:0")
    four = write_run(tmp_path / "four", strategy="ddp", nproc=4, epoch_s=(4.0, 3.0, 3.0), device="cuda:0")
    rows = {r["run"]: r for r in scaling_rows([finished_run(four), finished_run(two)])}
    assert rows["four"]["speedup"] == pytest.approx(2.0) and rows["four"]["efficiency"] == pytest.approx(1.0)
    assert rows["four"]["baseline"] == "two"


def test_compare_and_report_give_the_same_speedup(tmp_path):
    """One definition: a 1-worker and a DDP x2 run of the same config read the same in both commands."""
    runs = [
        write_run(tmp_path / "runs" / "a"),
        write_run(tmp_path / "runs" / "b", strategy="ddp", nproc=2, epoch_s=(8.0, 6.25, 6.25)),
    ]
    compared = {r["run"]: r["speedup"] for r in scaling_rows([finished_run(r) for r in runs])}
    result = build_report([tmp_path / "runs"], tmp_path / "report")
    with open(result["points_csv"]) as f:
        reported = [float(p["speedup"]) for p in csv.DictReader(f) if p["speedup"]]
    assert reported == pytest.approx([18 / 10.5]) and compared["b"] == pytest.approx(reported[0])


def test_runs_sharing_a_folder_name_are_told_apart(tmp_path):
    runs = [write_run(tmp_path / "x" / "run"), write_run(tmp_path / "y" / "run", epoch_s=(5.0, 5.0, 5.0))]
    rows = scaling_rows([finished_run(r) for r in runs])
    assert [r["run"] for r in rows] == ["x/run", "y/run"] and rows[1]["speedup"] == pytest.approx(2.25)
    assert "over x/run's" in format_rows(rows)


def test_compare_command_prints_table_and_refuses_non_runs(tmp_path, capsys):
    write_run(tmp_path / "a")
    assert main(["compare", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "speedup" in out and "baseline" in out and "70.00" in out
    (tmp_path / "empty").mkdir()
    assert main(["compare", str(tmp_path / "empty")]) == 2
    assert "not a finished ddplab run" in capsys.readouterr().err
    (tmp_path / "started").mkdir()
    (tmp_path / "started" / "metrics.jsonl").write_text(epoch_line(1))
    assert main(["compare", str(tmp_path / "started")]) == 2
    assert "after 1 epoch" in capsys.readouterr().err


def test_compare_shows_each_runs_slowest_rank_and_names_a_chronic_straggler(tmp_path):
    import json

    even = write_run(tmp_path / "even", strategy="ddp", nproc=2)
    slow = write_run(tmp_path / "slow", strategy="ddp", nproc=2)
    for folder, stragglers in (
        (even, {"verdict": "noise", "spread_cv": 0.02, "straggler": None, "last_share": [0.55, 0.45], "said": "x"}),
        (
            slow,
            {
                "verdict": "chronic",
                "spread_cv": 0.02,
                "straggler": {"ranks": [1], "host": "10.211.0.2", "last_share": 0.97, "slower": 0.38},
                "last_share": [0.03, 0.97],
                "said": "x",
            },
        ),
    ):
        summary = json.loads((folder / "summary.json").read_text())
        (folder / "summary.json").write_text(json.dumps({**summary, "stragglers": stragglers}))
    rows = {r["run"]: r for r in scaling_rows([finished_run(even), finished_run(slow)])}
    assert rows["even"]["slowest"] == "0 (55%)" and rows["slow"]["slowest"] == "1 (97%)"
    text = format_rows(list(rows.values()))
    assert "slowest rank" in text.splitlines()[0]
    assert "straggler in slow: rank 1 on host 10.211.0.2, chronically 38% slower" in text
    assert "straggler in even" not in text


def test_a_run_whose_workers_changed_is_shown_stretch_by_stretch_and_never_taken_as_a_scaling_point(tmp_path):
    """A 4-worker run resumed on 2 (dist.on_resize) has no one number of workers: the table says "4 then 2" and gives
    it no speedup, and the 1-worker run stays the baseline of the 4-worker one."""
    import json

    one = write_run(tmp_path / "one", epoch_s=(12.0, 10.0, 10.0), device="cuda:0")
    four = write_run(tmp_path / "four", strategy="ddp", nproc=4, epoch_s=(8.0, 4.0, 4.0), device="cuda:0")
    resized = write_run(tmp_path / "resized", strategy="ddp", nproc=4, epoch_s=(8.0, 4.0, 6.0), device="cuda:0")
    summary = json.loads((resized / "summary.json").read_text())
    summary["membership"] = [
        {"from_step": 0, "to_step": 20, "workers": 4, "nodes": 1, "images_per_s": 500.0},
        {"from_step": 20, "to_step": 30, "workers": 2, "nodes": 1, "images_per_s": 300.0},
    ]
    (resized / "summary.json").write_text(json.dumps(summary))
    rows = {r["run"]: r for r in scaling_rows([finished_run(p) for p in (one, four, resized)])}
    assert rows["resized"]["world_size"] == "4 then 2" and rows["resized"]["speedup"] is None
    assert rows["four"]["speedup"] == pytest.approx(3.0) and rows["four"]["baseline"] == "one"
    assert "4 then 2" in format_rows(list(rows.values()))


def test_compare_gives_each_ranks_steps_and_waits_where_the_clocks_measured_them(tmp_path):
    """Each rank's step, data wait and all-reduce wait, median, p95 and max (summary.json's ranks, from the step
    clocks), under the table, for a run of two or more ranks; a run without them (one rank, or before the clocks)
    says nothing, and one from before the waits gives its steps alone."""
    import json

    two = write_run(tmp_path / "two", strategy="ddp", nproc=2)
    summary = json.loads((two / "summary.json").read_text())
    clocks = {
        "step_median_s": [0.0334, 0.0361],
        "step_p95_s": [0.0547, 0.0558],
        "step_max_s": [0.1791, 0.1485],
        "data_median_s": [0.0021, 0.0019],
        "data_p95_s": [0.0032, 0.0030],
        "data_max_s": [0.0101, 0.0088],
        "waited_median_s": [0.0112, 0.0],
        "waited_p95_s": [0.0203, 0.0011],
        "waited_max_s": [0.0415, 0.0052],
    }
    ranks = {
        **summary.get("ranks", {}),
        **{k: {"per_rank": v, "max": max(v), "mean": sum(v) / 2} for k, v in clocks.items()},
    }
    (two / "summary.json").write_text(json.dumps({**summary, "ranks": ranks}))
    one = write_run(tmp_path / "one")
    runs = [finished_run(one), finished_run(two)]
    text = format_rows(scaling_rows(runs), runs)
    assert (
        "steps by rank in two (median/p95/max ms): 0 33.4/54.7/179.1, 1 36.1/55.8/148.5\n"
        "  waiting for data: 0 2.1/3.2/10.1, 1 1.9/3.0/8.8\n"
        "  waiting in the all-reduce for the last rank: 0 11.2/20.3/41.5, 1 0.0/1.1/5.2"
    ) in text
    assert "steps by rank in one" not in text
    for key in [k for k in clocks if not k.startswith("step")]:
        del ranks[key]
    (two / "summary.json").write_text(json.dumps({**summary, "ranks": ranks}))
    text = format_rows(scaling_rows(runs), [finished_run(one), finished_run(two)])
    assert "steps by rank in two" in text and "waiting" not in text
