"""One rule for every on/off environment variable (ddplab.io.environment): DDPLAB_WARM today."""

import os

import pytest

from ddplab.cli import main
from ddplab.errors import ConfigError
from ddplab.io.environment import switch
from ddplab.launch import warm


@pytest.mark.parametrize("value", ["0", "false", "OFF", " no ", "False"])
def test_every_spelling_of_off_turns_warm_starts_off(monkeypatch, value):
    monkeypatch.setenv("DDPLAB_WARM", value)
    assert warm.enabled() is False and warm.factory() is None


@pytest.mark.parametrize("value", ["1", "true", "On", "yes", ""])
def test_on_and_unset_mean_on(value):
    assert switch("X", True, {"X": value}) is True
    assert switch("X", False, {"X": value}) is (value != "")  # unset or empty: the default


def test_a_value_that_is_no_switch_is_one_line_before_anything_starts(monkeypatch, capsys, tmp_path):
    with pytest.raises(ConfigError, match=r"X='maybe' is not a switch: use one of 1, true, on, yes .* 0, false"):
        switch("X", True, {"X": "maybe"})
    monkeypatch.setenv("DDPLAB_WARM", "maybe")
    assert main(["train", "--dataset", "synthetic", "--out", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("ddplab: error: DDPLAB_WARM='maybe' is not")
    assert not (tmp_path / "r").exists()


def test_a_variable_set_for_a_block_is_as_it_was_after_it(monkeypatch):
    from ddplab.io.environment import restored

    monkeypatch.setenv("DDPLAB_TEST_SET", "before")
    monkeypatch.delenv("DDPLAB_TEST_UNSET", raising=False)
    with pytest.raises(RuntimeError), restored("DDPLAB_TEST_SET"), restored("DDPLAB_TEST_UNSET"):
        os.environ["DDPLAB_TEST_SET"] = os.environ["DDPLAB_TEST_UNSET"] = "inside"
        raise RuntimeError  # restored on an error too
    assert os.environ["DDPLAB_TEST_SET"] == "before" and "DDPLAB_TEST_UNSET" not in os.environ
