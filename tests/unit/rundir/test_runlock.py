"""Who holds a run folder: the one rule (`should_hold`) that a run's plan asks, for the root and its workers."""

import threading

import pytest

from ddplab.errors import ConfigError
from ddplab.rundir.runlock import run_lock, should_hold


@pytest.mark.parametrize(
    "rank, nodes, launcher_holds, holds",
    [
        (None, 1, False, True),  # the CLI / built-in launcher / a Python caller: the root of its tree
        (None, 2, False, False),  # a launcher of one node of many: the rank-0 worker holds instead
        (0, 1, False, True),  # torchrun / srun global rank 0
        (0, 1, True, False),  # ddplab's own launcher's rank 0: its launcher holds the folder
        (1, 1, False, False),  # any other rank never writes
    ],
)
def test_the_root_of_the_process_tree_holds_the_folder(rank, nodes, launcher_holds, holds):
    assert should_hold(rank, launching_nodes=nodes, launcher_holds=launcher_holds) is holds


def test_a_second_hold_in_one_process_is_refused_from_any_thread(tmp_path):
    with run_lock(tmp_path):
        with pytest.raises(ConfigError, match="in use by a run already started in this process"):
            with run_lock(tmp_path):
                pass
        caught = []

        def other():
            try:
                with run_lock(tmp_path):
                    pass
            except ConfigError as exc:
                caught.append(str(exc))

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert len(caught) == 1 and "in use by another thread of this process" in caught[0]
    with run_lock(tmp_path):  # released: free again
        pass


def test_a_live_owner_is_seen_waited_for_and_named_after_the_grace(tmp_path):
    """The sweep asks `live_owner` before it starts a run: a live holder (another process) is waited for, and
    named in one line if it keeps the folder past the grace; a stale lock file left by a dead one is free."""
    import subprocess
    import sys

    from ddplab.errors import ConfigError
    from ddplab.rundir.runlock import live_owner
    from ddplab.sweep.local import wait_for_owner

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, pathlib; from ddplab.rundir.runlock import run_lock\n"
            f"with run_lock(pathlib.Path({str(tmp_path)!r})):\n    print('held', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert live_owner(tmp_path)["pid"] == holder.pid
        said = []
        with pytest.raises(
            ConfigError,
            match=rf"still in use by pid {holder.pid} on .* after 0.3 s: a run of an earlier "
            "sweep training on",
        ):
            wait_for_owner(tmp_path, "[1/1] run", said.append, grace_s=0.3)
        assert said == [said[0]] and f"waiting for pid {holder.pid}" in said[0]
    finally:
        holder.stdin.close()
        holder.wait(30)
    assert live_owner(tmp_path) is None
    tmp_path.mkdir(exist_ok=True)  # the holder removed the folder it had made nothing in
    (tmp_path / ".lock").write_text('{"pid": 999999}')  # a lock file nobody holds: stale, free
    assert live_owner(tmp_path) is None


@pytest.mark.parametrize(
    "text, said",
    [
        (b"[1]", "another process"),
        (b'{"pid": "x", "host": 3, "argv": "ddplab", "started": "yesterday"}', "another process"),
        (b'{"pid": 12, "host": "h", "argv": ["ddplab", 7], "started": 0}', "pid 12 on h (, started"),
        (b"\xff\xfe", "another process"),
    ],
)
def test_a_lock_file_of_another_shape_names_whom_it_can_never_a_traceback(tmp_path, text, said):
    """The lock file is read back to name who holds a folder: an edited or foreign one was an AttributeError or
    TypeError traceback in the refusal's own line."""
    from ddplab.rundir.runlock import describe, owner_of

    (tmp_path / ".lock").write_bytes(text)
    assert describe(owner_of(tmp_path)).startswith(said)
