"""Warm starts (ddplab.launch.warm): a process forked from the warm server is the process exec would have made.

Each check runs the same command cold (subprocess, a fresh interpreter) and warm, and compares what
the child sees of itself, or the run it trained: equal, not close.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from ddplab.launch import warm
from ddplab.rundir import checkpoint

from support import tiers
from support.readers import metrics
from support.settings import TINY

pytestmark = [
    pytest.mark.slow(why="each case starts a cold Python too (3-5 s)"),
    pytest.mark.skipif(not warm.enabled(), reason="warm starts are off here (DDPLAB_WARM=0, or not Linux)"),
]

# What a child knows of itself that exec decides: compared key by key between a cold and a warm start.
FINGERPRINT = r"""
import json, os, random, resource, signal, sys
import numpy as np, torch
def text(path):
    return [x.decode(errors="replace") for x in open(path, "rb").read().split(b"\0") if x]
handlers = {}
for sig in signal.valid_signals():
    try:
        h = signal.getsignal(sig)
    except (OSError, ValueError):
        continue
    handlers[str(int(sig))] = h if isinstance(h, int) else getattr(h, "__name__", repr(h))
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "env": dict(os.environ),
    "proc_environ": sorted(text("/proc/self/environ")), "proc_cmdline": text("/proc/self/cmdline"),
    "own_session": os.getsid(0) == os.getpid(), "umask": os.umask(0o22),
    "affinity": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads(),
    "interop_threads": torch.get_num_interop_threads(),
    "handlers": handlers, "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "limits": {n: resource.getrlimit(getattr(resource, n)) for n in dir(resource) if n.startswith("RLIMIT_")},
    "fds": sorted(os.listdir("/proc/self/fd")),
    "seeds": [torch.initial_seed(), int(torch.randint(1 << 30, ()))] + [np.random.randint(1 << 30), random.random()],
    "torch": [torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark,
              torch.backends.cudnn.deterministic, torch.get_default_dtype() is torch.float32, torch.is_grad_enabled(),
              torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32],
    "stdio": [[s.encoding, s.errors, s.line_buffering, s.write_through, type(s.buffer).__name__]
              for s in (sys.stdin, sys.stdout, sys.stderr)],
    "main": [__name__, __spec__ is None, sorted(k for k in globals() if k.startswith("__"))],
    "cuda_initialized": torch.cuda.is_initialized(),
    "cpp_log_level": __import__("ctypes").c_int.in_dll(
        __import__("ctypes").CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so")),
        "FLAGS_caffe2_log_level").value,
    "network": [os.readlink("/proc/self/ns/net"), sorted(os.listdir("/sys/class/net"))],
}))
sys.stdout.flush()
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


def cold(argv, *, env=None, cwd=None, cpus=(), session=True):
    def before():
        if cpus:
            os.sched_setaffinity(0, cpus)

    return subprocess.run(
        argv, capture_output=True, text=True, env=env, cwd=cwd, start_new_session=session, preexec_fn=before
    )


def warmed(argv, *, env=None, cwd=None, cpus=(), session=True):
    r, w = os.pipe()
    err_r, err_w = os.pipe()
    proc = warm.popen(argv, stdout=w, stderr=err_w, env=env, cwd=cwd, session=session, cpus=cpus)
    os.close(w)
    os.close(err_w)
    assert proc is not None, "this command should have started warm"
    with open(r) as out, open(err_r) as err:
        stdout, stderr = out.read(), err.read()
    return subprocess.CompletedProcess(argv, proc.wait(), stdout, stderr)


def fingerprints(tmp_path, *args, env=None, cpus=(), prefix=()):
    argv = [*prefix, sys.executable, "-c", FINGERPRINT, *args]
    a, b = cold(argv, env=env, cwd=tmp_path, cpus=cpus), warmed(argv, env=env, cwd=tmp_path, cpus=cpus)
    assert a.returncode == b.returncode, (a.stderr, b.stderr)
    one, other = json.loads(a.stdout), json.loads(b.stdout)
    if os.geteuid() != 0:  # PR_SET_MM_MAP (what /proc shows of a warm child) may need CAP_SYS_RESOURCE
        for key in ("proc_environ", "proc_cmdline"):
            one.pop(key), other.pop(key)
    return one, other


def assert_same(one, other):
    assert one.keys() == other.keys()
    for key in one.keys() - {"seeds"}:  # a fresh interpreter's own: differ from one start to the next
        assert one[key] == other[key], key


@contextlib.contextmanager
def signals_set(ignored=(), blocked=()):
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in ignored}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_a_warm_child_sees_itself_as_a_cold_one_does(tmp_path):
    one, other = fingerprints(tmp_path, "3", env={**os.environ, "DDPLAB_TEST_MARK": "x"})
    assert_same(one, other)
    assert one["argv"] == ["-c", "3"] and one["own_session"] and one["env"]["DDPLAB_TEST_MARK"] == "x"
    assert one["fds"] == other["fds"] and not one["cuda_initialized"]
    again = fingerprints(tmp_path)[1]
    assert all(x != y for x, y in zip(again["seeds"], other["seeds"], strict=True))  # RNGs as fresh as a cold start's


def test_torchs_native_log_level_is_the_childs_own(tmp_path):
    """TORCH_CPP_LOG_LEVEL is read once, when torch loads (in the server, for a warm child): the child applies
    its own, so a multi-node launcher's quieted c10d logs stay quiet, and the workers it forks stay warm."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CPP_LOG_LEVEL"}
    one, other = fingerprints(tmp_path, env={**env, "TORCH_CPP_LOG_LEVEL": "FATAL"})
    assert one["cpp_log_level"] == other["cpp_log_level"] == 3
    argv = [sys.executable, "-c", FINGERPRINT]
    # From a server whose own torch loaded at FATAL, as a cold start reads each (c10's levels; 1: its default).
    with warm.Factory(env={**env, "TORCH_CPP_LOG_LEVEL": "FATAL"}) as f, warm.using(f):
        for level, value in (("ERROR", 2), ("1", 1), (None, 1), ("", 1)):
            warm_env = env if level is None else {**env, "TORCH_CPP_LOG_LEVEL": level}
            assert json.loads(warmed(argv, env=warm_env, cwd=tmp_path).stdout)["cpp_log_level"] == value, level


def test_a_command_in_a_host_starts_warm_inside_that_host(tmp_path):
    """`ip netns exec HOST python ...` (a host of ddplab.launch.hosts) forks warm and enters the host's network and a
    /sys of its own as ip does: the child sees the host's interfaces, not this machine's."""
    from ddplab.launch import hosts

    reason = hosts.why_not_available()
    if reason:
        tiers.skip("root", reason)
    with hosts.cluster(1) as cluster:
        one, other = fingerprints(tmp_path, prefix=cluster.exec_prefix(0))
    assert_same(one, other)
    assert other["network"][1] == ["eth0", "lo"] and other["network"][0] != os.readlink("/proc/self/ns/net")
    assert not warm.emulated(["ip", "netns", "exec", "no-such-host", sys.executable, "-c", "pass"])  # ip says why


def test_stdio_is_buffered_as_a_fresh_interpreter_buffers_it(tmp_path):
    for unbuffered in ("1", ""):
        env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
        if not unbuffered:
            env.pop("PYTHONUNBUFFERED")
        with warm.Factory(env=env) as f, warm.using(f):
            one, other = fingerprints(tmp_path, env=env)
        assert_same(one, other)


def test_thread_count_cpus_ignored_and_blocked_signals_and_limits_carry_as_exec_carries_them(tmp_path):
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 1000), hard))  # changed after the server started
    try:
        with signals_set(ignored=[signal.SIGHUP], blocked=[signal.SIGUSR1]):
            one, other = fingerprints(tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, cpus=[0])
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert_same(one, other)
    assert one["threads"] == 1 and one["affinity"] == [0] and one["handlers"][str(int(signal.SIGHUP))] == 1
    assert int(signal.SIGUSR1) in one["mask"] and one["limits"]["RLIMIT_NOFILE"][0] == min(soft, 1000)
    one, other = fingerprints(tmp_path, env={k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}, cpus=[0])
    assert_same(one, other)  # torch's default thread count follows the CPUs a fresh process may use
    assert one["threads"] == 1


def test_a_command_whose_start_up_environment_differs_gets_a_server_of_its_own(tmp_path, monkeypatch):
    """What an interpreter reads at start-up cannot be given to a fork: such a command is forked from a server
    started with its environment (PYTHONHASHSEED fixes str hashes: the warm child's equal a cold one's), up to
    MAX_SERVERS; past that, and for what no fork can run, it starts cold."""
    code = [sys.executable, "-c", "print(hash('ddplab'))"]
    seeded = {**os.environ, "PYTHONHASHSEED": "7"}
    with warm.Factory() as first, warm.using(first):
        first.start()
        assert first.fits(os.environ) and not first.fits(seeded)
        for changed in ({"LD_PRELOAD": ""}, {"MKL_NUM_THREADS": "1"}, {"TORCH_LOGS": "dynamo"}, {"LANG": "C"}):
            assert not first.fits({**os.environ, **changed})
        assert first.fits({**os.environ, "OMP_NUM_THREADS": "1", "TORCHELASTIC_RUN_ID": "x", "DDPLAB_FAULT": "y"})
        done = warm.run(code, env=seeded, capture_output=True, text=True)
        second = warm.factory(seeded)
        assert second is not None and second is not first and second.pid is not None
        assert warm.server_pids() == {first.pid, second.pid}
        assert done.stdout == subprocess.run(code, env=seeded, capture_output=True, text=True).stdout
        monkeypatch.setattr(warm.client, "MAX_SERVERS", 2)
        assert warm.factory({**os.environ, "PYTHONHASHSEED": "8"}) is None  # a third: cold
        done = warm.run(code, env={**os.environ, "PYTHONHASHSEED": "8"}, capture_output=True, text=True)
        assert done.stdout == subprocess.run(code, env={**os.environ, "PYTHONHASHSEED": "8"}, capture_output=True,
                                             text=True).stdout  # fmt: skip
    assert warm.popen([sys.executable, "-X", "dev", "-c", "1"]) is None  # flags this interpreter does not run with
    assert warm.popen(["/bin/true"]) is None


def test_a_ddplab_folder_in_the_working_directory_is_never_the_servers(tmp_path, monkeypatch, capfd):
    """A sweep started in a checkout's parent (a ddplab/ folder beside it) had the server import that folder: a
    traceback from the server, every command cold. The working directory's modules are a command's own
    (docs/warm-starts.md: one the working directory would shadow is the server's); the child's sys.path[0] is still
    exec's."""
    (tmp_path / "ddplab").mkdir()
    (tmp_path / "ddplab" / "__init__.py").write_text("raise ImportError('the working directory s ddplab/')\n")
    monkeypatch.chdir(tmp_path)
    with warm.Factory() as f, warm.using(f):
        f.start()  # its stderr is this process's: captured here
        done = warmed([sys.executable, "-c", "import ddplab, sys; print(ddplab.__file__, sys.path[0] == '')"])
    assert done.returncode == 0 and done.stderr == "", done.stderr
    import ddplab

    assert done.stdout.split() == [ddplab.__file__, "True"]
    assert "Traceback" not in capfd.readouterr().err


def test_a_server_that_dies_takes_none_of_its_children_with_it(tmp_path):
    """SIGKILL to the warm server (as the OOM killer would pick it) killed the sweep point it had started: the
    children are this process's own (clone's CLONE_PARENT), so one goes on, ends with its own exit code, and the
    commands after it start cold."""
    if not warm.can_adopt():
        pytest.skip("no pidfd here (Linux 5.3+): children stay the server's")
    r, w = os.pipe()
    with warm.Factory() as f, warm.using(f):
        f.start()
        # Its own thread id where the C library keeps it (pthread_getcpuclockid reads it): once the server is gone, a
        # copy of the server's would name no thread, and reading the clock would fail.
        code = (
            "import sys, threading, time; n = len(sys.stdin.read()); "
            "time.clock_gettime(time.pthread_getcpuclockid(threading.get_ident())); sys.exit(n)"
        )
        proc = warm.popen([sys.executable, "-c", code], stdin=r)
        os.close(r)
        assert proc is not None and os.getppid() != proc.pid
        with open(f"/proc/{proc.pid}/stat") as stat:
            assert int(stat.read().rsplit(")", 1)[1].split()[1]) == os.getpid()  # its parent: this process
        os.kill(f.pid, signal.SIGKILL)
        os.waitpid(f.pid, 0) if f._server is None else f._server.wait()
        assert proc.poll() is None  # still running
        os.write(w, b"abc")
        os.close(w)
        assert proc.wait(timeout=30) == 3
        assert warm.popen([sys.executable, "-c", "1"]) is None  # the server is gone: cold from here on


def test_a_child_dies_with_the_process_it_was_started_for(tmp_path):
    """Its parent is that process: when it dies (a SIGKILL too) the child is stopped with SIGTERM, as before."""
    if not warm.can_adopt():
        pytest.skip("no pidfd here (Linux 5.3+): children stay the server's")
    client = (
        "import sys; from ddplab.launch import warm\n"
        "p = warm.popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "print(p.pid, flush=True); time = __import__('time'); time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", client], stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    proc.kill()
    proc.wait()
    import time

    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{child}") and open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, f"the warm child {child} outlived its client"
        time.sleep(0.05)


def test_exit_codes_signals_and_output_are_the_childs_own(tmp_path):
    def outcome(code):
        return warm.run([sys.executable, "-c", code], capture_output=True, text=True, input="in")

    assert outcome("import sys; print(sys.stdin.read()); sys.exit(3)").returncode == 3
    done = outcome("raise ValueError('boom')")
    assert done.returncode == 1 and "ValueError: boom" in done.stderr
    assert outcome("import os, signal; os.kill(os.getpid(), signal.SIGKILL)").returncode == -signal.SIGKILL
    assert outcome("raise KeyboardInterrupt").returncode == -signal.SIGINT  # as the interpreter ends on it
    assert outcome("import sys; print('x' * 200000); sys.exit('bad')").stdout == "x" * 200000 + "\n"
    assert outcome("import sys; sys.stdout.write('a\\r\\nb')").stdout == "a\nb"  # text mode as subprocess's
    with pytest.raises(subprocess.TimeoutExpired):
        warm.run([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.5)


def test_the_server_imports_what_its_callers_hand_in_before_it_forks():
    """The server imports torch alone of its own accord; ddplab's modules are handed in by whoever starts the
    children (the launcher its workers', the sweep its points'), imported once, and every later child has them."""
    probe = [sys.executable, "-c", "import sys; print('ddplab.report.html' in sys.modules)"]
    assert warm.run(probe, capture_output=True, text=True).stdout == "False\n"  # nobody handed it in yet
    assert warm.run(probe, capture_output=True, text=True, imports=["ddplab.report.html"]).stdout == "True\n"
    assert warm.run(probe, capture_output=True, text=True).stdout == "True\n"  # imported once, for every child
    assert not any(name.startswith("ddplab") for name in warm.IMPORTS)


def test_the_warm_server_is_no_worker_to_the_watchdog_its_children_are():
    """A launcher starts its server before the rendezvous: the watchdog must still see no worker started (else a
    rendezvous host never reached goes unnamed), and must see the workers forked from it. Run in a fresh process, as
    a launcher is: a test process may hold children of earlier tests (a server being reaped), which are workers to
    the watchdog."""
    code = textwrap.dedent(
        """
        import os, sys
        from ddplab.launch import warm, watchdog

        warm.prestart()
        assert warm.server_pids() and warm.server_pids() <= set(watchdog.descendants(os.getpid()))
        assert not watchdog.workers_started(), "the server alone counted as a worker"
        r, w = os.pipe()
        proc = warm.popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=r)
        os.close(r)
        try:
            assert proc is not None and watchdog.workers_started(), "a worker forked from the server went unseen"
        finally:
            os.close(w)
            assert proc.wait(timeout=30) == 0
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, "ok\n"), done.stderr


def test_the_server_never_initialized_cuda_before_a_fork(tmp_path):
    """On a CUDA machine the child must be able to initialize CUDA itself (a forked CUDA context is broken)."""
    if not torch.cuda.is_available():
        pytest.skip("cuda: no CUDA device (on a CPU there is no CUDA to initialize)")
    code = "import torch; assert not torch.cuda.is_initialized(); print(torch.zeros(1, device='cuda').item())"
    done = warm.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "0.0\n"), done.stderr


TINY = [*TINY, "--epochs", "2", "--batch-size", "16"]


def weights(run_dir):
    return checkpoint.load(run_dir / "checkpoints" / checkpoint.LAST)["model"]


@pytest.mark.parametrize("nproc", [1, 2], ids=["single", "ddp-2-workers"])
def test_a_run_started_warm_ends_bit_identical_to_one_started_cold(tmp_path, nproc):
    """Augmentation and dropout on: every RNG a run draws from is its own seeding's, warm or cold."""
    dist = ["--strategy", "ddp", "--nproc", "2", "--backend", "gloo"] if nproc == 2 else []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = {}
    for how, start in (("cold", cold), ("warm", warmed)):
        out = tmp_path / how
        done = start([sys.executable, "-m", "ddplab", "train", *TINY, *dist, "--out", str(out)], env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        runs[how] = out
    assert metrics(runs["cold"]) == metrics(runs["warm"])
    a, b = weights(runs["cold"]), weights(runs["warm"])
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
