"""The launcher watchdog's parts that need no second host (the rest: tests/distributed/test_network.py)."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

from ddplab import watchdog


@pytest.fixture
def listener():
    server = socket.create_server(("127.0.0.1", 0))
    yield server
    server.close()


@pytest.mark.parametrize("timeout_s", [5, 600, 7 * 24 * 3600])
def test_the_probe_takes_any_timeout_the_config_allows(listener, timeout_s):
    """Linux refuses more than 127 keep-alive probes: at the default 600 s the probe could not be opened,
    and the watchdog took that for a host it cannot reach."""
    probe = watchdog.open_probe("127.0.0.1", listener.getsockname()[1], timeout_s)
    with probe:
        assert probe.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == min(127, timeout_s - 1)
        assert probe.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == timeout_s * 1000
        assert probe.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 1


def test_a_store_that_closes_the_probe_is_not_a_lost_host(listener):
    """The store's host ending its run (or dying: the kernel resets the connection) is the agent's to report."""
    guard = watchdog.Watchdog(grace_s=1, interrupted_line=str, endpoint=listener.getsockname(), timeout_s=5,
                              lost_line=lambda e: pytest.fail("taken for lost"), unreached_line=lambda e: pytest.fail("unreached"))
    thread = threading.Thread(target=guard.watch_endpoint, daemon=True)
    thread.start()
    conn, _ = listener.accept()
    conn.close()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_descendants_are_found_below_children(tmp_path):
    """kill_descendants must reach a worker's own children (a DataLoader's, a compiler's)."""
    script = "import subprocess, sys, time; p = subprocess.Popen(['sleep', '30']); print(p.pid, flush=True); time.sleep(30)"
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
