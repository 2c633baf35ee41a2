"""ddplab.launch.process: the one way the sweep, the benchmarks and gpu_check run a command as a process tree."""

import os
import sys
import time
from pathlib import Path

from ddplab.launch import process


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def gone(pid: int) -> bool:
    """True once `pid` has exited (a zombie waiting for its reaper counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_each_attempt_is_appended_under_its_command(tmp_path):
    log = tmp_path / "logs" / "run.log"
    first = process.supervise(python("print('first attempt')"), log)
    second = process.supervise(python("print('second attempt')"), log)
    assert (first.code, first.error, second.code, second.error) == (0, None, 0, None)
    text = log.read_text()
    assert text.index("first attempt") < text.index("second attempt")
    assert text.count("\n$ ") == 2 and f"$ {sys.executable} -c print('second attempt')" in text
    assert process.last_line(log) == "second attempt"


def test_a_failure_says_its_error_line_from_the_last_attempt_only(tmp_path):
    log = tmp_path / "run.log"
    process.supervise(python("import sys; print('ddplab: error: the old one'); sys.exit(2)"), log)
    done = process.supervise(
        python("import sys; print('ddplab: error: the new one'); print('chatter'); sys.exit(3)"), log
    )
    assert (done.code, done.error) == (3, "the new one")
    plain = process.supervise(python("import sys; print('one'); print('the last line'); sys.exit(1)"), log)
    assert plain.error == "the last line"
    assert process.supervise(python("import sys; sys.exit(1)"), log).error == "no output"


def test_a_timeout_stops_the_whole_tree_and_says_so(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    child = (
        "import subprocess, sys, time\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(g.pid))\n"
        "time.sleep(120)\n"
    )
    done = process.supervise(
        python(child), tmp_path / "run.log", timeout_s=1, poll_s=0.1, timeout_from="sweep --timeout"
    )
    assert done.code == process.TIMED_OUT and done.wall_s >= 1
    assert done.error == "the command did not finish within 1 s (sweep --timeout); stopped"
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10  # SIGTERM was sent to the group before supervise returned; give it time to land
    while not gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(grandchild), "the child's own child outlived the timeout"


def test_ctrl_c_stops_the_tree_as_ctrl_c_stops_a_run(tmp_path):
    ready, calls = tmp_path / "sleeping", []

    def interrupt_once():  # Ctrl-C while the child sleeps
        calls.append(ready.exists())
        if calls.count(True) == 1 and calls[-1]:
            raise KeyboardInterrupt

    child = (
        f"import pathlib, time\ntry:\n    pathlib.Path({str(ready)!r}).touch()\n    time.sleep(120)\n"
        "except KeyboardInterrupt:\n    print('stopped by SIGINT')\n    raise SystemExit(130)\n"
    )
    done = process.supervise(python(child), tmp_path / "run.log", on_poll=interrupt_once, poll_s=0.1)
    assert done.code == process.INTERRUPTED and done.wall_s < process.STOP_GRACE_S
    assert process.last_line(done.log) == "stopped by SIGINT"  # SIGINT, as Ctrl-C sends it, not SIGKILL
    assert calls[-1] and calls.count(True) == 2  # and once more at the end, to show the last progress


def test_on_poll_runs_while_the_command_runs_and_once_after(tmp_path):
    seen = []
    marker = tmp_path / "started"
    child = f"import time, pathlib\npathlib.Path({str(marker)!r}).touch()\ntime.sleep(0.6)\n"
    done = process.supervise(
        python(child), tmp_path / "run.log", on_poll=lambda: seen.append(marker.exists()), poll_s=0.05
    )
    assert done.code == 0 and len(seen) >= 3 and seen[-1]


def test_env_and_cwd_reach_the_command(tmp_path):
    env = {**os.environ, "DDPLAB_PROCESS_TEST": "here"}
    done = process.supervise(
        python("import os; print(os.environ['DDPLAB_PROCESS_TEST'], os.getcwd())"),
        tmp_path / "run.log",
        env=env,
        cwd=tmp_path,
    )
    assert process.last_line(done.log) == f"here {tmp_path}"


def test_ddplab_command_uses_this_interpreter():
    assert process.ddplab_command("train", "--epochs", "1") == [
        sys.executable,
        "-m",
        "ddplab",
        "train",
        "--epochs",
        "1",
    ]


def test_a_child_that_ignores_its_timeout_is_killed_after_the_grace_without_blocking_its_owner(tmp_path, monkeypatch):
    monkeypatch.setattr(process, "STOP_GRACE_S", 0.5)
    stubborn = (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(120)\n"
    )
    child = process.Child(python(stubborn), tmp_path / "run.log", timeout_s=0.3)
    polls, start = 0, time.monotonic()
    while (done := child.poll(wait_s=0.05)) is None:
        polls += 1
        assert time.monotonic() - start < 20
    assert done.code == process.TIMED_OUT and polls > 10  # each poll returned at once: others could be served
    assert done.wall_s >= 0.8 and "did not finish within 0.3 s" in done.error


def test_stopping_children_keeps_the_code_of_one_that_had_exited_on_its_own(tmp_path):
    failed = process.Child(python("raise SystemExit(3)"), tmp_path / "failed.log")
    sleeping = process.Child(python("import time\ntime.sleep(120)"), tmp_path / "sleeping.log")
    deadline = time.monotonic() + 20
    while failed.proc.poll() is None:  # it fails before the Ctrl-C
        assert time.monotonic() < deadline
        time.sleep(0.01)
    codes = [done.code for done in process.stop_all([failed, sleeping], grace_s=5)]
    assert codes == [3, process.INTERRUPTED]
