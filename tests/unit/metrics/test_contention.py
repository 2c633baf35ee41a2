"""What a run competed with: the kernel's counters read right, per-node arithmetic, a real competitor seen."""

import math
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from ddplab.metrics import contention
from ddplab.metrics.contention import CpuSnapshot, epoch_contention, rank_interval, read_pressure, read_proc_stat
from ddplab.metrics.gpu import GpuSampler
from ddplab.rundir.epochs import is_machine_field
from ddplab.rundir.summary import contention_summary

from support.runs import epoch_record

STAT = """cpu  1000 50 300 9000 20 10 40 100 0 0
cpu0 500 25 150 4500 10 5 20 50 0 0
cpu1 500 25 150 4500 10 5 20 50 0 0
intr 12345
"""
PRESSURE = """some avg10=1.38 avg60=1.41 avg300=0.58 total=5264792
full avg10=0.00 avg60=0.00 avg300=0.00 total=0
"""


def test_proc_stat_busy_and_steal_in_seconds(tmp_path):
    path = tmp_path / "stat"
    path.write_text(STAT)
    ticks = __import__("os").sysconf("SC_CLK_TCK")
    busy, steal, cpus = read_proc_stat(str(path))
    assert busy == pytest.approx((1000 + 50 + 300 + 10 + 40) / ticks)  # user nice system irq softirq; not idle/iowait
    assert steal == pytest.approx(100 / ticks) and cpus == 2


def test_pressure_is_psi_some_total_in_seconds(tmp_path):
    path = tmp_path / "cpu"
    path.write_text(PRESSURE)
    assert read_pressure(str(path)) == pytest.approx(5.264792)


def test_missing_counters_are_unknown_not_zero(tmp_path):
    assert read_proc_stat(str(tmp_path / "none")) == (None, None, 0)
    assert read_pressure(str(tmp_path / "none")) is None
    (tmp_path / "bad").write_text("cpu  x y\n")
    assert read_proc_stat(str(tmp_path / "bad")) == (None, None, 0)
    a = CpuSnapshot(wall_s=0.0, own_cpu_s=1.0, busy_s=None, steal_s=None, pressure_s=None, cpus=4, node=7)
    b = CpuSnapshot(wall_s=2.0, own_cpu_s=2.5, busy_s=None, steal_s=None, pressure_s=None, cpus=4, node=7)
    record = epoch_contention([rank_interval(a, b)], wall_s=2.0)
    assert record["rank_cpu_s"] == [1.5]
    assert record["other_cpu_share"] is None and record["steal_share"] is None and record["cpu_pressure_share"] is None
    assert record["gpu_other_processes"] is None


def test_other_processes_are_the_node_minus_this_runs_ranks_worst_node_reported():
    # Node 1: 4 CPUs, 10 s: busy 24 CPU-s, the two ranks used 8 + 8 -> others 8 of 40 = 20%.
    # Node 2: 4 CPUs: busy 10, its rank used 9 -> others 1 of 40 = 2.5%; steal 4 of 40 = 10%.
    rows = [
        [8.0, 24.0, 0.0, 1.0, 4.0, 1.0, math.nan],
        [8.0, 24.0, 0.0, 1.0, 4.0, 1.0, math.nan],
        [9.0, 10.0, 4.0, 3.0, 4.0, 2.0, 2.0],
    ]
    record = epoch_contention(rows, wall_s=10.0)
    assert record["rank_cpu_s"] == [8.0, 8.0, 9.0]
    assert record["other_cpu_share"] == 0.2 and record["steal_share"] == 0.1
    assert record["cpu_pressure_share"] == 0.3 and record["gpu_other_processes"] == 2


def test_a_competing_process_is_seen_and_this_process_is_not_counted_as_one():
    """A child burns 0.6 s of CPU while this process waits: the machine's other use rises, ours does not."""
    start = contention.snapshot()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    end = contention.snapshot()
    if start.busy_s is None:
        pytest.skip("this machine has no /proc/stat")
    wall = end.wall_s - start.wall_s
    record = epoch_contention([rank_interval(start, end)], wall_s=wall)
    assert record["rank_cpu_s"][0] < 0.2  # waiting costs no CPU
    # The child's 0.6 s (and its interpreter's start-up) is someone else's; /proc/stat counts in ticks.
    assert record["other_cpu_share"] * wall * end.cpus > 0.5


@pytest.mark.alone(why="a pytest-xdist worker beside it is other load")
def test_own_busy_time_is_not_other_load():
    start = contention.snapshot()
    t = time.process_time()
    while time.process_time() - t < 0.5:
        pass
    end = contention.snapshot()
    if start.busy_s is None:
        pytest.skip("this machine has no /proc/stat")
    record = epoch_contention([rank_interval(start, end)], wall_s=end.wall_s - start.wall_s)
    assert record["rank_cpu_s"][0] >= 0.5
    # What else ran meanwhile (the test runner's other threads, the kernel) is small next to 0.5 s of ours.
    assert record["other_cpu_share"] * (end.wall_s - start.wall_s) * end.cpus < 0.25


class ProcessesNVML:
    def __init__(self, counts):
        self.counts = counts

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [SimpleNamespace(pid=p) for p in range(self.counts[handle])]


def test_other_processes_on_a_gpu_are_counted_beyond_this_one():
    assert GpuSampler([0, 1], nvml=ProcessesNVML({0: 1, 1: 3})).other_processes() == 2
    assert GpuSampler([0], nvml=ProcessesNVML({0: 1})).other_processes() == 0
    assert GpuSampler([], nvml=None).other_processes() is None  # no GPU: not measured


def test_every_contention_field_counts_as_a_machine_field_and_the_summary_keeps_the_worst():
    fields = epoch_contention([[1.0, 2.0, 0.0, 0.0, 2.0, 1.0, 0.0]], wall_s=1.0)
    assert all(is_machine_field(k) for k in fields)
    history = [
        epoch_record(1, other_cpu_share=0.05, load_avg_1m=1.5),
        epoch_record(2, other_cpu_share=0.4, load_avg_1m=None),
    ]
    summary = contention_summary(history)
    assert summary["max_other_cpu_share"] == 0.4 and summary["max_load_avg_1m"] == 1.5
    assert summary["max_steal_share"] is None
