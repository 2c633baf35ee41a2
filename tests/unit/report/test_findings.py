"""The report's findings (report/findings.py): a super-linear speedup flagged, every number one of the tables'."""

from ddplab.report.build import build_report

from support.reports import assert_findings_restate_tables
from support.runs import write_run


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
