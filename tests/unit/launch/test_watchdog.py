"""The launcher watchdog's parts that need no second host (the rest: tests/distributed/test_network.py)."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from ddplab.launch import watchdog


@pytest.fixture
def listener():
    server = socket.create_server(("127.0.0.1", 0))
    yield server
    server.close()


@pytest.mark.parametrize("timeout_s", [5, 600, 7 * 24 * 3600 * 4])  # the last: a week's timeout, 3 restarts
def test_the_probe_takes_any_timeout_the_config_allows(listener, timeout_s):
    """Linux refuses more than 127 keep-alive probes: at the default 600 s the probe could not be opened,
    and the watchdog took that for a host it cannot reach."""
    probe = watchdog.open_probe("127.0.0.1", listener.getsockname()[1], timeout_s)
    with probe:
        assert probe.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == min(127, timeout_s - 1)
        assert probe.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == min(timeout_s * 1000, 2**31 - 1)
        assert probe.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 1


def test_a_store_that_closes_the_probe_is_not_a_lost_host(listener, monkeypatch):
    """The store's host ending its run (or dying: the kernel resets the connection) is the agent's to report."""
    said = []
    monkeypatch.setattr(watchdog, "end_now", lambda line, code: said.append((line, code)))
    guard = watchdog.Watchdog(
        grace_s=1,
        interrupted_line=str,
        endpoint=listener.getsockname(),
        timeout_s=5,
        lost_line=lambda e: f"lost {e}",
        unreached_line=lambda e: f"unreached {e}",
    )
    thread = threading.Thread(target=guard.watch_endpoint, daemon=True)
    thread.start()
    conn, _ = listener.accept()
    conn.close()
    thread.join(timeout=5)
    assert not thread.is_alive() and said == []


def test_a_store_that_never_answers_is_named_after_the_timeout(monkeypatch):
    """Refused, then refused again: past the timeout (plus the agent's grace) the line that names it."""
    said = []
    monkeypatch.setattr(watchdog, "end_now", lambda line, code: said.append((line, code)))
    monkeypatch.setattr(watchdog, "UNREACHED_GRACE_S", 0)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens there
    guard = watchdog.Watchdog(
        grace_s=1,
        interrupted_line=str,
        endpoint=("127.0.0.1", port),
        timeout_s=1,
        lost_line=lambda e: f"lost {e}",
        unreached_line=lambda e: f"unreached {e}",
    )
    thread = threading.Thread(target=guard.watch_endpoint, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not said and time.monotonic() < deadline:
        time.sleep(0.05)
    guard.done.set()
    thread.join(timeout=5)
    assert said[:1] == [(f"unreached 127.0.0.1:{port}", 4)]


SIGNAL_SCRIPT = """
import os, signal, subprocess, sys
from ddplab.launch import watchdog
child = subprocess.Popen(["sleep", "60"])
print(child.pid, flush=True)
signal.signal(signal.SIGTERM, lambda *a: None)  # a handler that stops nothing, as the agent's while it is blocked
guard = watchdog.Watchdog(grace_s=1, interrupted_line=lambda name: f"interrupted by {name}")
with watchdog.guarded(guard):
    os.kill(os.getpid(), signal.SIGTERM)
    r, w = os.pipe()
    os.read(r, 1)  # blocked for good, as the agent in a store call across a dead link
"""


def test_a_signal_ends_a_blocked_launcher_and_its_children_after_the_grace():
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGNAL_SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    child = int(proc.stdout.readline())
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and err == "ddplab: error: interrupted by SIGTERM\n", err
    deadline = time.monotonic() + 5
    while (
        os.path.exists(f"/proc/{child}") and "Z" not in open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()[0]
    ):
        assert time.monotonic() < deadline, "the launcher's child outlived it"
        time.sleep(0.05)


def test_descendants_are_found_below_children(tmp_path):
    """kill_descendants must reach a worker's own children (a DataLoader's, a compiler's)."""
    script = (
        "import subprocess, sys, time; p = subprocess.Popen(['sleep', '30']); print(p.pid, flush=True); time.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    grandchild = int(child.stdout.readline())
    try:
        found = watchdog.descendants(os.getpid())
        assert child.pid in found and grandchild in found
        assert found.index(child.pid) < found.index(grandchild)
    finally:
        for pid in (grandchild, child.pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        child.wait()
