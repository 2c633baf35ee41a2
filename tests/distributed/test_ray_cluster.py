"""`ddplab sweep --executor ray` on a Ray cluster of two hosts with their own addresses (ddplab.launch.hosts):
`ray start --head` in host 0, `ray start --address` in host 1, the sweep started in host 0. Its points spread over
both hosts, a point across both nodes trains the run one host trains with as many workers, and a node lost under
a point (its raylet killed) ends that point resumable within the run's timeout plus seconds, naming the node; the
re-run resumes it bit-identically. SIGTERM of the sweep leaves no run on any node; what the cluster cannot run is
one line.

Needs root, iproute2 and Ray (the ray extra); skipped with the reason elsewhere.
"""

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import torch

from ddplab.launch import hosts
from ddplab.rundir import checkpoint
from ddplab.rundir.epochs import read_epochs, reproducible

from support import cli as commands
from support import tiers
from support.readers import leftover_processes
from support.sweeps import TINY_BASE, TWO_POINTS

pytestmark = pytest.mark.dist

TIMEOUT_S = 6  # dist.timeout_s of the point across nodes
MARGIN_S = 20  # a lost node's point ends within the timeout plus this: Ray's own notice of the node, the agent's end
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}  # a test cluster: no token, no reporting
ACROSS = """
[[variants]]
label = "two nodes"
"dist.strategy" = "ddp"
"dist.nnodes" = 2
"dist.timeout_s" = 6
"""


def sweep_file(path: Path, variants: str) -> Path:
    base = TINY_BASE.replace("epochs = 2", "epochs = 3").replace('device = "cpu"', 'device = "cpu"\nthreads = 1')
    path.write_text(base + variants)
    return path


class RayHosts:
    """A Ray cluster over the hosts of `cluster`: one CPU a node, each node's session files in a folder of its own
    (the hosts share this machine's /tmp), Ray's processes inside each host's namespace."""

    def __init__(self, cluster: hosts.Cluster):
        self.cluster = cluster
        self.temp = Path(tempfile.mkdtemp(prefix="ddr", dir="/tmp"))  # short: Ray's socket paths live below it
        self.address = f"{cluster.address(0)}:6379"
        self.hidden = self.temp / "hidden"
        self.hidden.mkdir()

    def start(self, i: int) -> None:
        """Ray on host i. Host 1 sees an empty folder at `hidden` (a tmpfs over it in its own mount namespace): a node
        that does not see a sweep folder the others see."""
        where = ["--head", "--port", "6379", "--include-dashboard", "false"] if i == 0 else ["--address", self.address]
        ray = [str(Path(sys.executable).parent / "ray"), "start", *where, "--node-ip-address", self.cluster.address(i),
               "--num-cpus", "1", "--num-gpus", "0", "--temp-dir", str(self.temp / f"h{i}"),
               "--disable-usage-stats"]  # fmt: skip
        if i == 1:
            ray = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                   f"mount -t tmpfs none {self.hidden} && exec {shlex.join(ray)}"]  # fmt: skip
        subprocess.run(
            [*self.cluster.exec_prefix(i), *ray],
            env={**os.environ, **RAY_ENV},
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )

    def raylet(self, i: int) -> int:
        for pid in hosts.processes_in(self.cluster.host(i)):
            try:
                if b"/raylet/raylet" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return pid
            except OSError:
                pass
        raise AssertionError(f"no raylet in host {i}")

    def sweep(self, path: Path, out: Path, marker: str, env=None):
        """`ddplab sweep FILE --executor ray` started in host 0, against the cluster."""
        return commands.popen(
            [*self.cluster.exec_prefix(0), sys.executable, "-m", "ddplab", "sweep", str(path), "--out", str(out),
             "--executor", "ray", "--ray.address", self.address, "--no-report", "--no-estimate"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **RAY_ENV, **commands.THREADS, marker: "1", **(env or {})},
        )  # fmt: skip


@pytest.fixture(scope="module")
def ray_hosts():
    tiers.importorskip("ray", "ray", "Ray comes with the ray extra (pip install 'ddplab[ray]')")
    reason = hosts.why_not_available()
    if reason:
        tiers.skip("root", reason)
    with hosts.cluster(2) as cluster:
        made = RayHosts(cluster)
        try:
            made.start(0)
            made.start(1)
            yield made
        finally:
            hosts.stop_processes([p for i in range(cluster.hosts) for p in hosts.processes_in(cluster.host(i))], 1.0)
            shutil.rmtree(made.temp, ignore_errors=True)


_one_host: dict = {}


@pytest.fixture(scope="module")
def one_host(tmp_path_factory):
    """one_host(point_config): the point across nodes' run trained by one host's two workers, made once."""

    def make(config: Path) -> Path:
        if "run" not in _one_host:
            out = tmp_path_factory.mktemp("one-host") / "run"
            proc = commands.ddplab_cli("train", "--config", config, "--nnodes", 1, "--nproc", 2, "--out", out,
                                          "--output.progress", "false")  # fmt: skip
            assert proc.returncode == 0, proc.stderr[-3000:]
            _one_host["run"] = out
        return _one_host["run"]

    return make


def assert_same_run(a: Path, b: Path) -> None:
    assert [reproducible(r, per_rank=False) for r in read_epochs(a / "metrics.jsonl")] == [
        reproducible(r, per_rank=False) for r in read_epochs(b / "metrics.jsonl")
    ]
    wa, wb = (checkpoint.load(d / "checkpoints" / checkpoint.LAST)["model"] for d in (a, b))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def gone(marker: str, within_s: float = 30) -> None:
    deadline = time.monotonic() + within_s
    while leftover_processes(marker):
        assert time.monotonic() < deadline, leftover_processes(marker)
        time.sleep(0.2)


def wait_for_checkpoint(sweep, run_dir: Path) -> None:
    deadline = time.monotonic() + 120
    while not (run_dir / "checkpoints" / "last.pt").is_file():  # its first epoch kept
        assert sweep.poll() is None and time.monotonic() < deadline, sweep.communicate()[1][-3000:]
        time.sleep(0.1)


def manifest(out: Path) -> dict:
    return {r["name"]: r for r in json.loads((out / "manifest.json").read_text())["runs"]}


def test_a_stopped_sweep_leaves_nothing_on_any_node_and_its_rerun_spreads_resumes_and_ends_as_one_host_does(
    ray_hosts, one_host, tmp_path
):
    """SIGTERM while the point across both nodes trains: every task cancelled, the point stopped resumable, no run
    process left on either host. Run again: that point resumes to the run one host trains with two workers; the two
    one-node points (one CPU a node) run at once, one on each host, and end as the local executor's runs."""
    marker, out = f"DDPLAB_TEST_{uuid.uuid4().hex}", tmp_path / "out"
    local = commands.ddplab_cli("sweep", sweep_file(tmp_path / "l.toml", TWO_POINTS), "--out", tmp_path / "local",
                                   "--no-report", "--no-estimate")  # fmt: skip
    assert local.returncode == 0, local.stderr[-3000:]
    path = sweep_file(tmp_path / "s.toml", ACROSS + TWO_POINTS)  # the point across nodes first: it takes both
    sweep = ray_hosts.sweep(path, out, marker, env={"DDPLAB_FAULT": "slow:epoch=2:ms=3000"})  # epoch 2: 24 s
    wait_for_checkpoint(sweep, out / "runs" / "two-nodes")
    sweep.send_signal(signal.SIGTERM)
    stdout, stderr = sweep.communicate(timeout=120)
    assert sweep.returncode == 130 and stderr.strip().splitlines()[-1] == "ddplab: interrupted by SIGTERM", stderr
    assert "3 to run on Ray (2 nodes, 2 CPUs)" in stdout, stdout
    runs = manifest(out)
    assert (runs["two-nodes"]["status"], runs["two-nodes"]["exit_code"]) == ("interrupted", 130), runs
    assert {r["status"] for r in runs.values()} == {"interrupted"}, runs
    gone(marker)
    rerun = ray_hosts.sweep(path, out, marker)
    stdout, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert "two-nodes: submitted to Ray (resuming" in stdout, stdout
    ends = {line.split(":")[0].split()[-1]: line for line in stdout.splitlines() if ": finished in" in line}
    a, b = (ray_hosts.cluster.address(i) for i in (0, 1))
    assert {f"({a})" in ends["a"], f"({a})" in ends["b"]} == {True, False}, stdout
    assert f"({a})" in ends["two-nodes"] and f"({b})" in ends["two-nodes"], stdout
    assert_same_run(out / "runs" / "two-nodes", one_host(out / "configs" / "two-nodes.toml"))
    for name in ("a", "b"):
        assert_same_run(out / "runs" / name, tmp_path / "local" / "runs" / name)
    gone(marker)


def test_a_node_lost_under_a_point_ends_it_resumable_naming_the_node_and_a_rerun_resumes_it_exactly(
    ray_hosts, one_host, tmp_path
):
    marker, out = f"DDPLAB_TEST_{uuid.uuid4().hex}", tmp_path / "out"
    path = sweep_file(tmp_path / "s.toml", ACROSS)
    sweep = ray_hosts.sweep(path, out, marker, env={"DDPLAB_FAULT": "slow:rank=1:epoch=2:ms=400"})  # epoch 2: 3 s
    wait_for_checkpoint(sweep, out / "runs" / "two-nodes")
    os.kill(ray_hosts.raylet(1), 9)
    cut = time.monotonic()
    stdout, stderr = sweep.communicate(timeout=TIMEOUT_S + MARGIN_S + 60)
    took = time.monotonic() - cut
    assert sweep.returncode == 1 and took < TIMEOUT_S + MARGIN_S, (took, stderr[-3000:])
    lost = next(line for line in stdout.splitlines() if "two-nodes: interrupted (resumable)" in line)
    assert f"({ray_hosts.cluster.address(1)}) lost: " in lost, stdout
    assert f"({ray_hosts.cluster.address(0)}) lost" not in lost, stdout  # the node left is stopped, not lost
    (run,) = manifest(out).values()
    assert (run["status"], run["exit_code"]) == ("interrupted", 130) and "lost" in run["error"], run
    assert len(read_epochs(out / "runs" / "two-nodes" / "metrics.jsonl")) < 3
    gone(marker)  # every node's run ended: the lost node's with its Ray worker, the other at the timeout
    ray_hosts.start(1)  # the node back
    rerun = ray_hosts.sweep(path, out, marker)
    stdout, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stderr[-3000:]
    assert "two-nodes: submitted to Ray (resuming" in stdout, stdout
    assert_same_run(out / "runs" / "two-nodes", one_host(out / "configs" / "two-nodes.toml"))
    gone(marker)


def test_a_node_that_does_not_see_the_sweep_folder_is_one_line_before_anything_is_written(ray_hosts):
    marker, out = f"DDPLAB_TEST_{uuid.uuid4().hex}", ray_hosts.hidden / "out"
    sweep = ray_hosts.sweep(sweep_file(ray_hosts.temp / "s.toml", TWO_POINTS), out, marker)
    stdout, stderr = sweep.communicate(timeout=300)
    assert sweep.returncode == 2, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == (
        f"ddplab: error: the Ray node {socket.gethostname()} ({ray_hosts.cluster.address(1)}) does not see "
        f"{ray_hosts.hidden} as this machine does: every node must see the sweep folder {out} (a shared file system)"
    )
    assert not out.exists()


def test_what_the_cluster_cannot_run_is_one_line_before_anything_is_written(ray_hosts, tmp_path):
    """A point across more nodes than the cluster has, one asking more than any node has, one across nodes with
    torchrun: each refused in one line, nothing written."""
    marker = f"DDPLAB_TEST_{uuid.uuid4().hex}"
    three = ACROSS.replace('"dist.nnodes" = 2', '"dist.nnodes" = 3')
    wide = '[[variants]]\nlabel = "wide"\n"train.threads" = 4096\n'
    torchrun = ACROSS + 'launch = "torchrun"\n'
    said = {}
    for name, variants in (("three", three), ("wide", wide), ("torchrun", torchrun)):
        sweep = ray_hosts.sweep(sweep_file(tmp_path / f"{name}.toml", variants), tmp_path / name, marker)
        _, stderr = sweep.communicate(timeout=120)
        assert sweep.returncode == 2, stderr[-3000:]
        said[name] = stderr.strip().splitlines()[-1]
    assert said["three"] == (
        "ddplab: error: sweep run two-nodes spans 3 nodes, each asking for 1 CPU(s) and 0 GPU(s), and the cluster "
        "has 2 such node(s) of 2"
    )
    assert said["wide"] == (
        "ddplab: error: sweep run wide asks for 4096 CPU(s) and 0 GPU(s) on one node, and the cluster's largest node "
        "has 1 and 0"
    )
    assert said["torchrun"] == (
        'ddplab: error: sweep run two-nodes spans 2 nodes with launch = "torchrun": on Ray each node runs '
        "ddplab's launcher (leave launch out, or run it with --executor slurm)"
    )
    assert not any((tmp_path / name).exists() for name in said)
