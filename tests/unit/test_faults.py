"""The fault injector's grammar (DDPLAB_FAULT): a typo is one line, never a silently clean run."""

import pytest

from ddplab import faults
from ddplab.errors import ConfigError


@pytest.mark.parametrize(
    "spec, parsed",
    [
        ("kill:rank=1:epoch=2:step=3", ("kill", {"rank": 1, "epoch": 2, "step": 3})),
        ("slow:rank=1:ms=40", ("slow", {"rank": 1, "ms": 40})),
        ("stall:rank=1:epoch=1:step=3", ("stall", {"rank": 1, "epoch": 1, "step": 3})),
        ("slowsave:epoch=2:ms=4000", ("slowsave", {"epoch": 2, "ms": 4000})),
        ("raise:rank=0:epoch=2:step=1:attempts=9", ("raise", {"rank": 0, "epoch": 2, "step": 1, "attempts": 9})),
    ],
)
def test_a_fault_reads_as_written(spec, parsed):
    assert faults.parse(spec) == parsed


@pytest.mark.parametrize(
    "spec",
    [
        "slow:rank=1",
        "kill:rank=1:ms=5",
        "sleep:rank=1",
        "kill:node=1",
        "slowsave:epoch=2",
        "slowsave:epoch=2:step=1:ms=5",
        "slowsave:rank=1:ms=5",
        "kill:rank",
        "kill:rank=x",
        "kill:rank=1.5",
        "kill:rank=1:rank=2",
        "slow:ms=-5",
        "kill:epoch=0",
        "kill:step=0",
        "kill:rank=-1",
        "raise:attempts=0",
        "",
    ],
)
def test_a_malformed_fault_is_one_line_naming_the_variable(spec):
    with pytest.raises(ConfigError, match=r"^DDPLAB_FAULT=.*expected kill\|raise\|hang\|stall\|stop"):
        faults.parse(spec)


def test_a_fault_the_run_cannot_fire_is_refused_before_it_starts(monkeypatch):
    monkeypatch.setenv("DDPLAB_FAULT", "kill:rank=1:epoch=2:step=3")
    faults.check_env(world_size=2, epochs=2)
    with pytest.raises(ConfigError, match=r"rank=1 would never fire: this run has ranks 0 to 0$"):
        faults.check_env(world_size=1, epochs=2)
    with pytest.raises(ConfigError, match=r"epoch=2 would never fire: this run trains 1 epoch$"):
        faults.check_env(world_size=2, epochs=1)
    faults.check_env(world_size=2, epochs=2, steps=3)
    with pytest.raises(
        ConfigError, match=r"step=3 would never fire: this run's epochs take at most 2 optimizer steps$"
    ):
        faults.check_env(world_size=2, epochs=2, steps=2)
    monkeypatch.delenv("DDPLAB_FAULT")
    faults.check_env(world_size=1, epochs=1)  # unset: nothing to check


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


def test_step_counts_from_one_as_epoch_does_so_the_least_step_fires_on_the_first(tmp_path, monkeypatch):
    """A run of 1 step an epoch: step=1 fires before it, and step=2 is refused."""
    from ddplab.cli import main

    args = [
        "train",
        "--dataset",
        "synthetic",
        "--data.synthetic_size",
        "32",
        "--data.image_size",
        "8",
        "--batch-size",
        "32",
        "--epochs",
        "1",
        "--device",
        "cpu",
        "--output.progress",
        "false",
        "--output.tensorboard",
        "false",
    ]
    monkeypatch.setenv("DDPLAB_FAULT", "raise:epoch=1:step=1")
    monkeypatch.setattr(faults, "_FAULT", faults._UNREAD)
    assert main([*args, "--out", str(tmp_path / "a")]) == 4
    monkeypatch.setenv("DDPLAB_FAULT", "raise:epoch=1:step=2")
    monkeypatch.setattr(faults, "_FAULT", faults._UNREAD)
    assert main([*args, "--out", str(tmp_path / "b")]) == 2 and not (tmp_path / "b").exists()


def test_the_samples_each_step_trained_are_read_back_as_written(tmp_path, monkeypatch):
    """DDPLAB_RECORD_SAMPLES: each rank's steps, read back merged by (epoch, step, round)."""
    from ddplab import faults
    from ddplab.topology import ROUND

    monkeypatch.setenv(faults.RECORD_ENV, str(tmp_path / "ids"))
    monkeypatch.setenv(ROUND, "2")
    faults.record_samples(0, 1, 5, [3, 1])
    faults.record_samples(1, 1, 5, [0, 2])
    faults.record_samples(0, 1, 6, [4])
    assert faults.recorded_samples(tmp_path / "ids") == {(1, 5, 2): [3, 1, 0, 2], (1, 6, 2): [4]}
