"""The check that closes scripts/test.sh (tests/support/tiers.py): a skip of a tier this machine has fails the suite."""

import json

import pytest

from support import tiers


def write(path, *passes):
    path.write_text("".join(json.dumps(p) + "\n" for p in passes))
    return path


def a_pass(name, passed, skipped=(), failed=0):
    return {"name": name, "passed": passed, "failed": failed, "errors": 0, "skipped": list(skipped)}


def test_a_skipped_tier_this_machine_has_fails_and_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(tiers.TIERS, "root", tiers.Tier("the test cluster", lambda: None))  # this machine has it
    monkeypatch.setitem(tiers.TIERS, "slurm", tiers.Tier("a Slurm", lambda: "no slurmctld"))  # and lacks this
    skips = [
        {"nodeid": "tests/distributed/test_network.py::test_a", "reason": "[root] ip: command not found"},
        {"nodeid": "tests/smoke/test_slurm.py::test_b", "reason": "[slurm] no Slurm here"},
        {"nodeid": "tests/unit/data/test_loader.py::test_c", "reason": "needs CUDA"},  # no machine fact: never checked
    ]
    record = write(tmp_path / "r", a_pass("in-process", 10, skips[2:]), a_pass("processes", 5, skips[:2], failed=1))
    assert tiers.check(record) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("tiers: 1 test(s) skipped a tier this machine has")
    assert out[1] == "  tests/distributed/test_network.py::test_a: [root] ip: command not found"
    assert "root ran" in out[-2] and "slurm not here (no slurmctld)" in out[-2]
    assert out[-1] == "suite: 15 passed, 1 failed, 3 skipped"  # the closing line, over every pass


def test_skips_of_tiers_the_machine_lacks_pass_and_no_pass_at_all_fails(tmp_path, monkeypatch, capsys):
    for name in tiers.TIERS:
        monkeypatch.setitem(tiers.TIERS, name, tiers.Tier(name, lambda: "not here"))
    skip = {"nodeid": "t::x", "reason": "[mlflow] MLflow comes with the mlflow extra"}
    assert tiers.check(write(tmp_path / "r", a_pass("alone", 3, [skip]))) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "suite: 3 passed, 0 failed, 1 skipped"
    assert tiers.check(write(tmp_path / "none")) == 1


def test_every_tier_skip_is_tagged_with_a_known_tier():
    assert tiers.tier_of(tiers.tagged("ray", "x")) == "ray"
    assert tiers.tier_of("[nope] x") is None and tiers.tier_of("CUDA graph capture needs a CUDA device") is None
    with pytest.raises(AssertionError):
        tiers.tagged("nope", "x")
