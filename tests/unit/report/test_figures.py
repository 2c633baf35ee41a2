"""The report's numbers (report/figures.py): training throughput, speedup, where a slow epoch went, overfitting."""

import pytest

from ddplab.report.build import build_report
from ddplab.report.figures import early_stop_epoch, overfitting
from ddplab.report.records import Row

from support.reports import assert_findings_restate_tables, read_csv, write_sweep
from support.runs import write_manifest, write_run


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


def test_overfitting_needs_test_loss_up_10_percent_while_train_loss_falls():
    def curve(train, test):
        return [
            {"epoch": i, "train_loss": a, "test_loss": b, "test_acc": 0.5 + i / 100}
            for i, (a, b) in enumerate(zip(train, test, strict=True), 1)
        ]

    found = overfitting(curve([1.0, 0.8, 0.6, 0.4], [1.0, 0.5, 0.6, 0.7]))
    assert (found.overfits, found.min_epoch, found.rise) == (True, 2, pytest.approx(0.4))
    assert (found.stop_epoch, found.stop_test_acc) == (4, 0.54)  # patience 2: epochs 3 and 4 did not improve
    assert not overfitting(curve([1.0, 0.8, 0.6, 0.4], [1.0, 0.5, 0.52, 0.55])).overfits  # +10% exactly: not beyond
    assert not overfitting(curve([1.0, 0.5, 0.6, 0.7], [1.0, 0.5, 0.6, 0.7])).overfits  # train loss rises too
    assert overfitting(curve([1.0], [1.0])) is None
    assert early_stop_epoch([{"epoch": i, "test_loss": v} for i, v in enumerate([3, 2, 1], 1)], 2) is None


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


def test_every_name_a_row_is_given_is_one_row_declares(tmp_path):
    """Row is what mypy checks the report's reads against: the names the code writes must all be in it."""
    from ddplab.report.figures import SHARES, run_row
    from ddplab.report.records import MEASURED, SETTINGS, TEXT
    from ddplab.report.runs import load_runs
    from ddplab.report.sections import build_sections

    declared = Row.__optional_keys__
    assert {f"{k}_std" for k in MEASURED} <= declared, "each measured figure's standard deviation is declared too"
    # read from Row's declaration in its order, which is the CSV files' column order: unchanged from the lists
    # these names were once written out in
    assert TEXT[:3] == ("strategy", "device", "device_name") and TEXT[-2:] == ("straggler", "slowest")
    assert SETTINGS == (
        "world_size",
        "nodes",
        "local_batch",
        "global_batch",
        "accumulate",
        "train_images",
        "test_images",
    )
    assert MEASURED[:3] == ("epochs", "final_test_acc", "best_test_acc") and len(TEXT) == 10 and len(MEASURED) == 26
    assert MEASURED[-10:-6] == SHARES and MEASURED[-4:] == (
        "probe_comm_ms",
        "ddp_exposed_ms",
        "ddp_comm_ms",
        "straggler_ms",
    )
    runs = load_runs([write_sweep(tmp_path)])
    run_rows = {r.name: run_row(r) for r in runs}
    sections = build_sections(runs, run_rows)
    written = {k for row in run_rows.values() for k in row} | {k for s in sections for row in s.rows for k in row}
    assert written <= declared, sorted(written - declared)
    assert {
        "status",
        "images_per_s",
        "images_per_s_std",
        "timing",
        "loads",
        "overfit",
        "acc_noise",
    } <= written


def test_a_chronic_straggler_is_said_by_rank_and_host_where_the_stragglers_cost_most():
    from ddplab.report.figures import straggler, why

    named = {
        "verdict": "chronic",
        "straggler": {"ranks": [3], "host": "10.211.0.2", "last_share": 0.91, "slower": 0.14},
    }
    text = straggler({"stragglers": named})  # type: ignore[typeddict-item]
    assert text == "rank 3 on host 10.211.0.2, chronically 14% slower"
    assert straggler({"stragglers": {"verdict": "noise", "straggler": None}}) is None  # type: ignore[typeddict-item]
    assert straggler({}) is None  # type: ignore[typeddict-item]  (written before the clocks)
    assert why("stragglers", {"straggler": text}, {}) == f"the ranks wait at each all-reduce for {text}"
    assert why("stragglers", {"straggler": None}, {}) == "the ranks wait for the slowest one at each all-reduce"
