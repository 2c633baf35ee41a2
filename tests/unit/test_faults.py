"""The fault injector's grammar (DDPLAB_FAULT): a typo is one line, never a silently clean run."""

import pytest

from ddplab import faults


@pytest.mark.parametrize("spec, parsed", [
    ("kill:rank=1:epoch=2:step=3", ("kill", {"rank": 1, "epoch": 2, "step": 3})),
    ("slow:rank=1:ms=40", ("slow", {"rank": 1, "ms": 40})),
    ("raise:rank=0:epoch=2:step=1:attempts=9", ("raise", {"rank": 0, "epoch": 2, "step": 1, "attempts": 9})),
])
def test_a_fault_reads_as_written(spec, parsed):
    assert faults.parse(spec) == parsed


@pytest.mark.parametrize("spec", ["slow:rank=1", "kill:rank=1:ms=5", "sleep:rank=1", "kill:node=1"])
def test_a_malformed_fault_is_refused(spec):
    with pytest.raises(ValueError, match="expected kill"):
        faults.parse(spec)
