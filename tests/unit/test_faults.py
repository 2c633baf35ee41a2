"""The fault injector's grammar (DDPLAB_FAULT): a typo is one line, never a silently clean run."""

import pytest

from ddplab import faults


@pytest.mark.parametrize("spec, parsed", [
    ("kill:rank=1:epoch=2:step=3", ("kill", {"rank": 1, "epoch": 2, "step": 3})),
    ("slow:rank=1:ms=40", ("slow", {"rank": 1, "ms": 40})),
    ("slowsave:epoch=2:ms=4000", ("slowsave", {"epoch": 2, "ms": 4000})),
    ("raise:rank=0:epoch=2:step=1:attempts=9", ("raise", {"rank": 0, "epoch": 2, "step": 1, "attempts": 9})),
])
def test_a_fault_reads_as_written(spec, parsed):
    assert faults.parse(spec) == parsed


@pytest.mark.parametrize("spec", ["slow:rank=1", "kill:rank=1:ms=5", "sleep:rank=1", "kill:node=1", "slowsave:epoch=2",
                                  "slowsave:epoch=2:step=1:ms=5"])
def test_a_malformed_fault_is_refused(spec):
    with pytest.raises(ValueError, match="expected kill"):
        faults.parse(spec)


def test_a_slow_save_holds_only_the_checkpoint_of_its_epoch(monkeypatch):
    slept = []
    monkeypatch.setattr(faults, "_FAULT", faults.parse("slowsave:epoch=2:ms=1500"))
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    faults.maybe_slow_save(1)
    faults.maybe_inject(0, 2, 1)  # not a step fault
    faults.maybe_slow_save(2)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # a restarted group runs clean
    faults.maybe_slow_save(2)
    assert slept == [1.5]
