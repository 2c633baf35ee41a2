"""The supported torch floor: older torch is refused in one line, newer APIs are optional."""

import dataclasses
import os

import pytest
import torch

from ddplab import compat
from ddplab.cli import main
from ddplab.errors import ConfigError
from ddplab.launch import elastic as launch
from ddplab.rundir.runplan import RunPlan

from support.old_torch import OLDEST, old_launch_config_class
from support.settings import REPO, tiny_config


def test_the_floor_is_the_one_the_tests_simulate_and_the_package_declares():

    assert ".".join(map(str, compat.MIN_TORCH)) == OLDEST
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'"torch>={OLDEST}"' in pyproject


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2.13.0", (2, 13)),
        ("2.11.0+cu130", (2, 11)),
        ("2.4.1", (2, 4)),
        ("2.14.0.dev20261101+cpu", (2, 14)),
        ("3.0", (3, 0)),
    ],
)
def test_parse_version(text, expected):
    assert compat.parse_version(text) == expected


@pytest.mark.parametrize("version, ok", [("2.3.1", False), ("1.13.1", False), ("2.4.0", True), ("2.11.0+cu130", True)])
def test_torch_below_the_floor_is_refused(monkeypatch, version, ok):
    monkeypatch.setattr(torch, "__version__", version)
    if ok:
        compat.check_torch()
    else:
        with pytest.raises(ConfigError, match=rf"needs torch >= 2\.4, this Python has torch {version}"):
            compat.check_torch()


def test_old_torch_gets_one_line_from_every_command_that_needs_torch(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch, "__version__", "2.1.2")
    for argv in (
        ["train", "--dataset", "synthetic", "--out", str(tmp_path / "r")],
        ["models"],
        ["kernels", "check"],
        ["sweep", "precision", "--dry-run"],
        ["eval", str(tmp_path)],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("ddplab: error: ddplab needs torch >= 2.4"), (argv, err)
    assert not (tmp_path / "r").exists()


@pytest.mark.slow(why="fresh Python processes, where torch is made unimportable")
def test_reading_run_folders_needs_no_torch(tmp_path, tiny_run):
    """`ddplab report` and `ddplab compare` in an interpreter where `import torch` fails (a laptop reading a
    cluster's run folders); the commands that need torch say so in one line, and a usage error is answered too."""
    import subprocess
    import sys

    run = tiny_run().run_dir

    def without_torch(*argv):
        code = (
            "import sys; sys.modules['torch'] = None\nfrom ddplab.cli import main\n"
            f"code = main({list(argv)!r})\nassert sys.modules['torch'] is None\nsys.exit(code)"
        )
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)

    report = without_torch("report", str(run), "--out", str(tmp_path / "rep"))
    assert report.returncode == 0, report.stderr[-3000:]
    assert (tmp_path / "rep" / "index.html").is_file() and "Traceback" not in report.stderr
    compare = without_torch("compare", str(run))
    assert compare.returncode == 0 and "run" in compare.stdout, compare.stderr[-3000:]
    links = without_torch("plan")  # the published links need no torch; measuring them does
    assert links.returncode == 0 and "nvlink" in links.stdout, links.stderr[-3000:]
    for argv in (["train", "--out", str(tmp_path / "r")], ["kernels", "check"], ["models"], ["plan", "--measure"]):
        proc = without_torch(*argv)
        assert proc.returncode == 2 and proc.stderr.strip() == (
            "ddplab: error: ddplab needs torch >= 2.4, and this Python has none: pip install 'torch>=2.4'"
        ), proc.stderr
    usage = without_torch("train", "--train.epoch", "3")
    assert usage.returncode == 2 and "did you mean --train.epochs?" in usage.stderr


@pytest.mark.slow(why="each script runs in a fresh Python under an old torch's version")
@pytest.mark.parametrize("script", ["scripts/gpu_check.py", "benchmarks/loop_overhead.py", "benchmarks/speedrun.py"])
def test_old_torch_gets_one_line_from_the_scripts_too(script):
    import subprocess
    import sys

    repo = REPO
    path = repo / script
    code = (
        "import runpy, sys, torch; torch.__version__ = '2.1.2'; "
        f"sys.path.insert(0, {str(path.parent)!r}); sys.argv = [{str(path)!r}, '--quick']; "
        f"runpy.run_path({str(path)!r}, run_name='__main__')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=repo)
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and f"{path.stem}: error: ddplab needs torch >= 2.4, this Python has torch 2.1.2" in err[0], (
        err
    )


def test_optional_launch_fields_are_dropped_only_where_torch_lacks_them():
    old = old_launch_config_class()
    kwargs = {"min_nodes": 1, "max_nodes": 1, "nproc_per_node": 2, "shutdown_timeout": 5}
    assert compat.accepted_kwargs(old, kwargs, optional={"shutdown_timeout"}) == {
        k: v for k, v in kwargs.items() if k != "shutdown_timeout"
    }
    from torch.distributed.launcher.api import LaunchConfig

    if "shutdown_timeout" in {f.name for f in dataclasses.fields(LaunchConfig)}:
        assert compat.accepted_kwargs(LaunchConfig, kwargs, optional={"shutdown_timeout"}) == kwargs
    # A field that no torch has is ddplab's bug, not an old torch: it is kept, and fails loudly.
    assert "no_such_field" in compat.accepted_kwargs(old, {**kwargs, "no_such_field": 1}, optional={"shutdown_timeout"})


def test_the_launch_configuration_builds_against_the_oldest_signature(monkeypatch, tmp_path):
    """Every LaunchConfig argument ddplab passes exists in torch 2.4, or is declared optional."""
    import torch.distributed.launcher.api as api

    newer_fields = {f.name for f in dataclasses.fields(api.LaunchConfig)}
    monkeypatch.setattr(api, "LaunchConfig", old_launch_config_class())
    seen = {}

    def fake_elastic_launch(config, entrypoint):
        seen["config"] = config
        return lambda *args: {0: None, 1: None}

    monkeypatch.setattr(api, "elastic_launch", fake_elastic_launch)
    config = tiny_config(tmp_path / "r", dist={"strategy": "ddp", "nproc": 2})
    assert launch.launch_workers(RunPlan(config, None, True, None)) is None
    built = seen["config"]
    assert type(built).__name__ == "LaunchConfig" and built.nproc_per_node == 2 and built.max_restarts == 0
    # The stand-in carries this torch's newer fields at their defaults: shutdown_timeout (torch 2.12+) at torch's
    # 30 s, not ddplab's 5 s; a torch without the field (2.11 on the first GPU, 2026-11-26) has no attribute.
    if "shutdown_timeout" in newer_fields:
        assert built.shutdown_timeout == 30
    else:
        assert not hasattr(built, "shutdown_timeout")


@pytest.mark.skipif(
    not compat.elastic_signals_configurable(), reason="this torch's LaunchConfig has no signals_to_handle"
)
def test_the_elastic_agent_is_told_to_leave_sigint_to_the_launcher(monkeypatch, tmp_path):
    """Its default includes SIGINT: it would forward Ctrl-C to workers that block it, then SIGKILL them."""
    import torch.distributed.launcher.api as api

    seen = {}

    def fake_elastic_launch(config, entrypoint):
        seen["config"] = config
        return lambda *args: {0: None, 1: None}

    monkeypatch.setattr(api, "elastic_launch", fake_elastic_launch)
    launch.launch_workers(RunPlan(tiny_config(tmp_path / "r", dist={"strategy": "ddp", "nproc": 2}), None, True, None))
    assert seen["config"].signals_to_handle == compat.agent_signals_without_sigint() == "SIGTERM,SIGHUP,SIGQUIT"


@pytest.mark.skipif(
    not compat.elastic_signals_configurable(), reason="this torch's LaunchConfig has no signals_to_handle"
)
def test_a_launcher_started_under_nohup_keeps_sighup_ignored(monkeypatch):
    """`nohup ddplab train --nproc 2 &`: the agent would stop the run on SIGHUP when the terminal closed."""
    import signal

    monkeypatch.setattr(signal, "getsignal", lambda sig: signal.SIG_IGN if sig == signal.SIGHUP else signal.SIG_DFL)
    assert compat.agent_signals_without_sigint() == "SIGTERM,SIGQUIT"


def test_every_newer_api_says_what_is_lost():
    for name, what in compat.NEWER_APIS.items():
        assert "torch 2." in what and ("older" in what or "without" in what), name


def test_no_torch_at_all_is_one_line(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(ConfigError, match="needs torch >= 2.4, and this Python has none"):
        compat.check_torch()


def test_custom_ops_write_their_schema_out():
    """torch 2.4-2.6 cannot infer a schema from string or list[int] annotations (the kernels would not import)."""
    import ast
    import importlib
    import inspect

    for name in ("conv_relu", "rgb_to_gray"):
        module = importlib.import_module(f"ddplab.kernels.{name}")  # the package re-exports a function of that name
        calls = [
            node
            for node in ast.walk(ast.parse(inspect.getsource(module)))
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.library.custom_op"
        ]
        assert calls and all(any(k.arg == "schema" for k in call.keywords) for call in calls), module.__name__
    assert str(torch.ops.ddplab.conv_relu.default._schema) == (
        "ddplab::conv_relu(Tensor x, Tensor weight, Tensor? bias, int[] stride, int[] padding, int[] dilation, "
        "str backend) -> Tensor"
    )
    assert str(torch.ops.ddplab.rgb_to_gray.default._schema) == "ddplab::rgb_to_gray(Tensor x, str impl) -> Tensor"


def test_ddp_buffer_sync_follows_the_installed_signature(monkeypatch):
    import torch.nn as nn

    class OldDDP:  # torch < 2.13: no forward_sync_buffers
        def __init__(self, module, broadcast_buffers=True, bucket_cap_mb=25):
            pass

    class NewDDP:
        def __init__(self, module, broadcast_buffers=None, forward_sync_buffers=None):
            pass

    monkeypatch.setattr(nn.parallel, "DistributedDataParallel", OldDDP)
    assert compat.ddp_buffer_sync() == {"broadcast_buffers": True}
    monkeypatch.setattr(nn.parallel, "DistributedDataParallel", NewDDP)
    assert compat.ddp_buffer_sync() == {"forward_sync_buffers": True}


def test_ddps_own_timings_are_read_where_this_torch_keeps_them():
    """DDP keeps running averages (ns) over the steps it timed: its first ten, then one in `every`. Totals are
    average x samples in seconds; two totals give the mean of the steps between them. None without the method;
    no samples before a step was timed, with other field names, or an iteration it does not say."""

    class Ddp:
        def __init__(self, data):
            self.data, self.rate = data, None

        def _get_ddp_logging_data(self):
            return self.data

        def _set_ddp_runtime_logging_sample_rate(self, rate):
            self.rate = rate

    assert [compat.ddp_samples(it, 1) for it in (0, 5, 30)] == [0, 5, 30]
    assert [compat.ddp_samples(it, 100) for it in (5, 30, 99, 100, 250)] == [5, 10, 10, 11, 12]
    assert compat.ddp_samples(40, 20) == 12 and compat.ddp_samples(20, 5) == 12  # 20, 40 / 15, 20 past the first ten
    names = dict(
        avg_forward_compute_time=2_000_000,
        avg_backward_compute_time=4_000_000,
        avg_backward_comm_time=3_000_000,
        avg_backward_compute_comm_overlap_time=1_000_000,
    )
    before = compat.ddp_timing_totals(Ddp({**names, "iteration": 10}), every=1)
    assert before == {
        "samples": 10,
        "ddp_forward_s": 0.02,
        "ddp_backward_s": 0.04,
        "ddp_comm_s": 0.03,
        "ddp_overlap_s": 0.01,
    }
    # ten more steps took 6 ms of comm each: the running average is now 4.5 ms over 20
    after = compat.ddp_timing_totals(Ddp({**names, "avg_backward_comm_time": 4_500_000, "iteration": 20}), every=1)
    means = compat.ddp_epoch_means(before, after)
    assert means["ddp_comm_s"] == pytest.approx(0.006) and means["ddp_forward_s"] == pytest.approx(0.002)
    assert compat.ddp_epoch_means(after, after) is None and compat.ddp_epoch_means(None, after) is None
    assert compat.ddp_timing_totals(object(), 1) is None
    for nothing_yet in (
        {"avg_forward_compute_time": 1, "iteration": 3},
        names,
        {**names, "iteration": 3, "avg_backward_compute_time": 0},
    ):
        assert compat.ddp_timing_totals(Ddp(nothing_yet), 1)["samples"] == 0  # other names, no iteration, none timed
    assert compat.ddp_epoch_means(compat.ddp_timing_totals(Ddp(names), 1), before) is not None  # from nothing yet
    ddp = Ddp(names)
    assert compat.sample_ddp_every(ddp, 20) == 20 and ddp.rate == 20
    assert compat.sample_ddp_every(object(), 1) == compat.DDP_DEFAULT_SAMPLE_EVERY


def test_torchs_native_log_level_can_be_set_after_it_loaded():
    """A warm child's torch loaded in its server: TORCH_CPP_LOG_LEVEL is applied through c10's flag, which every
    torch this project supports exports (else the child's c10d logs stay at the server's level)."""
    import ctypes
    import os

    import torch

    from ddplab import compat

    flag = ctypes.c_int.in_dll(
        ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so")), "FLAGS_caffe2_log_level"
    )
    before = flag.value
    try:
        assert compat.set_cpp_log_level("FATAL") and flag.value == 3
        assert compat.set_cpp_log_level("error") and flag.value == 2
        assert compat.set_cpp_log_level("0") and flag.value == 0
        assert compat.set_cpp_log_level("LOUD") and flag.value == 1  # as c10 reads a value it does not know
        assert compat.set_cpp_log_level("") and flag.value == 1
    finally:
        flag.value = before


def test_the_elastic_agents_signal_handlers_never_outlive_its_launch(monkeypatch):
    """torch's agent sets its handlers for the stop signals and SIGQUIT and never puts the old ones back: a sweep
    that measured its all-reduce in-process then met Ctrl-C with the agent's SignalException (a traceback, exit
    1). Its stop, where it took one, begins the command's: a second signal is ignored."""
    import signal

    import torch.distributed.launcher.api as api
    from torch.distributed.elastic.multiprocessing.api import SignalException, _terminate_process_handler

    from ddplab import stops

    before = {s: signal.getsignal(s) for s in stops.TAKEN_BY_LIBRARIES}

    def fake_elastic_launch(config, entrypoint):
        def run(*args):
            for sig in stops.TAKEN_BY_LIBRARIES:
                signal.signal(sig, _terminate_process_handler)  # as PContext.start sets them
            if args == ("stop",):
                raise SignalException("Process 1 got signal: 15", sigval=signal.SIGTERM)
            return {0: entrypoint(*args)}

        return run

    monkeypatch.setattr(api, "elastic_launch", fake_elastic_launch)
    assert launch.run_agent(None, lambda x: x + 1, 1) == {0: 2}
    assert {s: signal.getsignal(s) for s in stops.TAKEN_BY_LIBRARIES} == before and not stops.stopping()
    with stops.as_interrupts():
        with pytest.raises(SignalException):
            launch.run_agent(None, print, "stop")
        assert {s: signal.getsignal(s) for s in stops.TAKEN_BY_LIBRARIES} != before  # ddplab's, for the block
        assert stops.stopping()
        os.kill(os.getpid(), signal.SIGTERM)  # ignored: the stop is under way
    assert {s: signal.getsignal(s) for s in stops.TAKEN_BY_LIBRARIES} == before
