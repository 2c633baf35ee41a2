"""Who holds a run folder: the one rule (`should_hold`) that the launcher and the worker both ask."""

import pytest

from ddplab.engine.runlock import HELD_ENV, run_lock, should_hold


@pytest.mark.parametrize("rank, nodes, holds", [
    (None, 1, True),   # the CLI / built-in launcher / a Python caller: the root of its tree
    (None, 2, False),  # a launcher of one node of many: the rank-0 worker holds instead
    (0, 1, True),      # torchrun / srun global rank 0
    (0, 2, True),      # ... also when it is a multi-node run's rank-0 worker
    (1, 1, False),     # any other rank never writes
])
def test_the_root_of_the_process_tree_holds_the_folder(tmp_path, monkeypatch, rank, nodes, holds):
    monkeypatch.delenv(HELD_ENV, raising=False)
    assert should_hold(tmp_path, rank, launching_nodes=nodes) is holds


def test_nobody_below_a_holder_takes_the_lock_again(tmp_path, monkeypatch):
    monkeypatch.setenv(HELD_ENV, str(tmp_path.resolve()))  # a worker whose launcher holds this folder
    assert not should_hold(tmp_path, 0)
    assert should_hold(tmp_path, None)  # no launcher started this process: it only inherited the variable
    monkeypatch.delenv(HELD_ENV)
    with run_lock(tmp_path):  # a nested call (launch -> train) in the holding process
        assert not should_hold(tmp_path, None)
    assert should_hold(tmp_path, None)
