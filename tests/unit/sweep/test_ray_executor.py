"""A point across nodes on Ray (sweep/ray_executor.py's Started): one outcome from every node's, decided by the
sweep, and which nodes it names lost. Ray itself is faked here (its tasks' outcomes given); the executor on a real
Ray: tests/smoke/test_ray.py (a local one) and tests/distributed/test_ray_cluster.py (two hosts)."""

import dataclasses
from types import SimpleNamespace

import pytest

from ddplab.config import RunConfig
from ddplab.launch.process import INTERRUPTED
from ddplab.sweep.point import Outcome, Point
from ddplab.sweep.ray_executor import Started, Task
from ddplab.sweepdir.folder import Status, SweepFolder

from support import tiers


class RayError(Exception):
    pass


class TaskCancelledError(RayError):
    pass


class RayTaskError(RayError):
    cause = None


class FakeRay:
    """Each task's result as the test gives it: (Outcome, node) or a Ray error to raise."""

    exceptions = SimpleNamespace(RayError=RayError, TaskCancelledError=TaskCancelledError, RayTaskError=RayTaskError)

    def __init__(self, results):
        self.results = results

    def get(self, ref, timeout=None):
        result = self.results[ref]
        if isinstance(result, Exception):
            raise result
        return result


def across(tmp_path, results, lost=None, summary=True):
    config = RunConfig()
    config = dataclasses.replace(config, dist=dataclasses.replace(config.dist, strategy="ddp", nnodes=len(results)))
    run_dir = tmp_path / "runs" / "p"
    run_dir.mkdir(parents=True)
    if summary:
        (run_dir / "summary.json").write_text("{}")
    point = Point(SweepFolder(tmp_path), "p", config)
    task = Task(str(tmp_path), "p", config.to_dict(), "ddplab", {}, str(tmp_path))
    s = Started(point, None, "[1/1] p", None, task, {}, refs=list(range(len(results))), group=object())
    s.done = {rank for rank, r in enumerate(results) if r is not None}
    s.nodes = {rank: (f"id{rank}", f"10.0.0.{rank + 1}") for rank in range(len(results))}
    s.lost = lost or {}
    return s.outcome(FakeRay(dict(enumerate(results))))


def ran(code, error=None, wall=3.0, node="h"):
    status = {0: Status.FINISHED, INTERRUPTED: Status.INTERRUPTED}.get(code, Status.FAILED)
    return Outcome(status, code, error, wall), node


def test_every_node_exiting_0_with_the_runs_summary_finishes_it_whichever_node_wrote_the_summary(tmp_path):
    # Global rank 0 (the summary's writer) was on node 1: node 0 saw no summary when it exited, and that is no failure.
    outcome, where = across(
        tmp_path, [ran(0, "the run exited 0 but left no summary.json", 3.0, "a"), ran(0, None, 4.0, "b")]
    )
    assert (outcome.status, outcome.exit_code, outcome.error, outcome.wall_s, where) == (
        Status.FINISHED, 0, None, 4.0, "a, b"
    )  # fmt: skip
    outcome, _ = across(tmp_path / "none", [ran(0), ran(0)], summary=False)
    assert outcome.status is Status.FAILED and outcome.error == "the run exited 0 but left no summary.json"


def test_a_node_that_failed_is_named_and_one_that_was_stopped_leaves_the_point_resumable(tmp_path):
    outcome, _ = across(tmp_path / "a", [ran(1, "worker rank 1 failed: boom"), ran(INTERRUPTED, "interrupted")])
    assert (outcome.status, outcome.exit_code, outcome.error) == (
        Status.FAILED,
        1,
        "node 0: worker rank 1 failed: boom",
    )
    outcome, _ = across(tmp_path / "b", [ran(0), ran(INTERRUPTED, "interrupted by SIGINT")])
    assert (outcome.status, outcome.exit_code) == (Status.INTERRUPTED, INTERRUPTED)
    outcome, _ = across(tmp_path / "c", [TaskCancelledError(), TaskCancelledError()])  # stopped before either ran
    assert outcome.status is Status.INTERRUPTED


def test_a_lost_node_leaves_the_point_resumable_naming_it_and_only_it(tmp_path):
    """A node Ray lost under its task, or one given up on (silent, or marked dead): the point is resumable whatever the
    others' runs said of it (a timeout naming the lost peer), and only the lost node is named."""
    outcome, _ = across(
        tmp_path / "a", [ran(1, "rank 1 on 10.0.0.2 did not reach the collective"), RayError("node died")]
    )
    assert (outcome.status, outcome.exit_code) == (Status.INTERRUPTED, INTERRUPTED)
    assert outcome.error == "node 1 (10.0.0.2) lost: Ray: node died"
    outcome, where = across(
        tmp_path / "b", [None, ran(INTERRUPTED, "stopped", node="b")], lost={0: "Ray marked it dead"}
    )
    assert outcome.error == "node 0 (10.0.0.1) lost: Ray marked it dead" and where == "b"
    assert outcome.status is Status.INTERRUPTED


@pytest.mark.parametrize("nodes", [2, 3])
def test_a_point_across_nodes_waits_only_on_the_tasks_still_running(nodes):
    s = Started(None, None, "t", None, None, {}, refs=[f"r{i}" for i in range(nodes)], group=object())
    s.done, s.lost = {0}, {nodes - 1: "silent"}
    assert s.waiting_on() == [f"r{i}" for i in range(1, nodes - 1)]


def test_a_tracked_sweeps_points_carry_their_parent_run_to_whichever_node_runs_them(tmp_path):
    """MLflow on Ray as on the local executor: each point's task carries the sweep's parent run, its label and axis
    values (point.py's env, the one rule), so its run logs as the parent's child on any node."""
    import json

    from ddplab import tracking
    from ddplab.sweep.ray_executor import RayExecutor
    from ddplab.sweepdir.folder import Entry, Manifest

    folder = SweepFolder(tmp_path)
    tracking.RunIds("sqlite:///m.db", "parent1", "0").write(tmp_path)
    folder.write(Manifest([Entry("lr-0.1", "runs/lr-0.1", point={"optim.lr": 0.1})], name="s"))
    task, ask = RayExecutor().task(Point(folder, "lr-0.1", RunConfig()), {"KEEP": "1"})
    link = json.loads(task.env[tracking.POINT_ENV])
    assert task.env["KEEP"] == "1" and task.cwd and ask["num_cpus"] == 1.0
    assert (link["parent_run_id"], link["label"], link["axes"]) == ("parent1", "lr-0.1", {"optim.lr": "0.1"})


def test_an_address_where_something_else_listens_is_one_line_within_the_timeout_not_a_hang(monkeypatch):
    """ray.init waited past 150 s on a port where a silent TCP service or an HTTP server listened. Ray's head (GCS,
    and its Client server behind ray://) speaks gRPC, whose first frame answers HTTP/2's preface."""
    import http.server
    import socket
    import threading
    import time

    from ddplab.errors import ConfigError
    from ddplab.sweep import ray_executor

    monkeypatch.setattr(ray_executor, "CONNECT_TIMEOUT_S", 0.5)
    with socket.create_server(("127.0.0.1", 0)) as silent:
        start = time.monotonic()
        with pytest.raises(ConfigError, match=r"is not a Ray cluster: .*answered nothing within 0.5 s"):
            ray_executor.reachable(f"127.0.0.1:{silent.getsockname()[1]}")
        assert time.monotonic() - start < 2.0
    web = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        with pytest.raises(ConfigError, match=r"is not a Ray cluster: .*answered b'"):
            ray_executor.reachable(f"ray://127.0.0.1:{web.server_address[1]}")
    finally:
        web.shutdown()
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    with pytest.raises(ConfigError, match=r"cannot reach the Ray cluster at 127.0.0.1:\d+ \(ConnectionRefusedError"):
        ray_executor.reachable(f"127.0.0.1:{port}")


def test_a_grpc_server_passes_the_check_as_a_ray_head_would():
    grpc = tiers.importorskip("ray", "grpc", "gRPC comes with Ray (the ray extra)")
    from concurrent import futures

    from ddplab.sweep import ray_executor

    server = grpc.server(futures.ThreadPoolExecutor(1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        ray_executor.reachable(f"127.0.0.1:{port}")
        ray_executor.reachable(f"ray://127.0.0.1:{port}")
    finally:
        server.stop(None)


def test_the_executors_refuse_what_a_python_caller_passes_wrong_before_any_folder(tmp_path):
    from ddplab import run_sweep
    from ddplab.errors import ConfigError
    from ddplab.sweep import LocalExecutor
    from ddplab.sweep.ray_executor import RayExecutor

    for bad in (0, -1, True, 1.5, "two"):
        with pytest.raises(ConfigError, match=r"LocalExecutor\(parallel=.*\): the points to run at once are a whole"):
            LocalExecutor(parallel=bad)
        with pytest.raises(ConfigError, match=r"RayExecutor\(parallel="):
            RayExecutor(parallel=bad)
    assert LocalExecutor(parallel="auto").parallel == "auto" and RayExecutor().parallel is None
    for bad in (0, -3, float("inf"), "10"):
        with pytest.raises(ConfigError, match=r"LocalExecutor\(timeout_s=.*\): seconds a run may take"):
            LocalExecutor(timeout_s=bad)
    for bad in ("", "  ", 6379):
        with pytest.raises(ConfigError, match=r"RayExecutor\(address=.*\): a cluster's host:port"):
            RayExecutor(address=bad)
    with pytest.raises(ConfigError, match=r"executor=42 is neither an executor's name \(local, slurm, ray\) nor an"):
        run_sweep("optimizers", executor=42, out=tmp_path / "s")
    assert not (tmp_path / "s").exists()


def test_the_sweep_command_says_every_executor_and_refuses_an_empty_ray_address(capsys):
    from ddplab.cli import main
    from ddplab.sweep.executor import registered

    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    helped = " ".join(capsys.readouterr().out.split())
    for name, executor in registered().items():
        assert f"{name}: {' '.join(executor.summary.split())}" in helped
    with pytest.raises(SystemExit) as usage:
        main(["sweep", "optimizers", "--executor", "ray", "--ray.address", ""])
    assert usage.value.code == 2 and "--ray.address: an empty value" in capsys.readouterr().err


def test_a_point_that_would_go_on_without_a_lost_node_is_refused_before_ray_starts(tmp_path, monkeypatch):
    """On Ray a lost node ends its point (resumable): a run asking to survive one (dist.min_nodes) is refused in
    one line before any cluster is reached or folder made, not cancelled half-way."""
    from ddplab.errors import ConfigError
    from ddplab.sweep import ray_executor
    from ddplab.sweepdir.spec import load_sweep

    (tmp_path / "s.toml").write_text(
        '[sweep]\nname = "elastic"\n[base.dist]\nstrategy = "ddp"\nnnodes = 3\nmin_nodes = 2\n'
        'on_resize = "keep_global_batch"\nmax_restarts = 1\n[grid]\n"train.epochs" = [1]\n'
    )
    sweep = load_sweep(tmp_path / "s.toml")
    monkeypatch.setattr(ray_executor, "connect", lambda *a: pytest.fail("reached the cluster"))
    with pytest.raises(ConfigError, match=r"may go on without a lost node \(dist\.min_nodes=2 of 3\): on Ray"):
        ray_executor.RayExecutor().submit(sweep, SweepFolder(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
