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


def test_a_live_owner_is_seen_waited_for_and_named_after_the_grace(tmp_path):
    """The sweep asks `live_owner` before it starts a run: a live holder (another process) is waited for, and
    named in one line if it keeps the folder past the grace; a stale lock file left by a dead one is free."""
    import subprocess
    import sys

    from ddplab.engine.runlock import live_owner
    from ddplab.errors import ConfigError
    from ddplab.sweep.runner import wait_for_owner

    holder = subprocess.Popen([sys.executable, "-c", "import sys, pathlib; from ddplab.engine.runlock import run_lock\n"
                               f"with run_lock(pathlib.Path({str(tmp_path)!r})):\n    print('held', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert live_owner(tmp_path)["pid"] == holder.pid
        said = []
        with pytest.raises(ConfigError, match=rf"still in use by pid {holder.pid} on .* after 0.3 s: a run of an earlier "
                                              "sweep training on"):
            wait_for_owner(tmp_path, "[1/1] run", said.append, grace_s=0.3)
        assert said == [said[0]] and f"waiting for pid {holder.pid}" in said[0]
    finally:
        holder.stdin.close()
        holder.wait(30)
    assert live_owner(tmp_path) is None
    tmp_path.mkdir(exist_ok=True)  # the holder removed the folder it had made nothing in
    (tmp_path / ".lock").write_text('{"pid": 999999}')  # a lock file nobody holds: stale, free
    assert live_owner(tmp_path) is None
