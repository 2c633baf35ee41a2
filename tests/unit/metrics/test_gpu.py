"""GPU sampling against a fake NVML: what is sampled, how it is summarized, what lands in the run folder."""

import json
import threading
from types import SimpleNamespace

from ddplab.metrics.gpu import GpuSampler, load_nvml, nvml_index, summarize

from support.settings import tiny_config


class FakeNVML:
    """pynvml's functions, with scripted readings; `ready` is set once `wanted` samples were taken."""

    def __init__(
        self,
        util=(10, 50, 90),
        used_mib=(1000, 3000, 2000),
        power_mw=(100_000, 200_000, 300_000),
        wanted=3,
        fail_after=None,
    ):
        self.util, self.used, self.power = util, used_mib, power_mw
        self.calls, self.wanted, self.fail_after = 0, wanted, fail_after
        self.ready = threading.Event()
        self.handles = []

    def nvmlDeviceGetHandleByIndex(self, index):
        self.handles.append(index)
        return index

    def nvmlDeviceGetUtilizationRates(self, handle):
        if self.fail_after is not None and self.calls >= self.fail_after:
            self.ready.set()
            raise RuntimeError("GPU is lost")
        value = self.util[min(self.calls, len(self.util) - 1)]
        return SimpleNamespace(gpu=value)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=self.used[min(self.calls, len(self.used) - 1)] * 2**20)

    def nvmlDeviceGetPowerUsage(self, handle):
        value = self.power[min(self.calls, len(self.power) - 1)]
        self.calls += 1
        if self.calls >= self.wanted:
            self.ready.set()
        return value


def sample_until_ready(sampler, nvml):
    sampler.start()
    assert nvml.ready.wait(timeout=30), "the sampler thread took no samples"
    return sampler.stop()


def test_samples_what_nvml_reports_in_the_units_of_the_files():
    nvml = FakeNVML()
    rows = sample_until_ready(GpuSampler([1], rank=3, interval_s=0.001, nvml=nvml, clock_zero=0.0), nvml)
    assert len(rows) >= 3 and nvml.handles == [1]
    first = rows[:3]
    assert [r["util_pct"] for r in first] == [10.0, 50.0, 90.0]
    assert [r["mem_used_mib"] for r in first] == [1000.0, 3000.0, 2000.0]
    assert [r["power_w"] for r in first] == [100.0, 200.0, 300.0]
    assert {r["rank"] for r in rows} == {3} and {r["gpu"] for r in rows} == {1}
    assert all(a["t_s"] <= b["t_s"] for a, b in zip(rows, rows[1:], strict=False))


def test_summary_is_mean_utilization_and_peak_memory():
    rows = [
        {"util_pct": u, "mem_used_mib": m, "power_w": p}
        for u, m, p in ((10, 1000, 100), (50, 3000, None), (90, 2000, 300))
    ]
    assert summarize(rows) == {"mean_util_pct": 50.0, "peak_mem_used_mib": 3000.0, "mean_power_w": 200.0, "samples": 3}
    assert summarize([])["mean_util_pct"] is None


def test_without_gpu_or_nvml_nothing_is_measured_and_the_reason_is_kept(monkeypatch):
    cpu = GpuSampler([])
    assert not cpu.measured and cpu.reason == "no GPU (training on the CPU)" and cpu.start().stop() == []
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert load_nvml() == (None, "nvidia-ml-py is not installed (pip install nvidia-ml-py)")
    no_nvml = GpuSampler([0])
    assert not no_nvml.measured and "nvidia-ml-py" in no_nvml.reason


def test_a_driver_that_stops_answering_ends_sampling_not_training():
    nvml = FakeNVML(fail_after=2)
    sampler = GpuSampler([0], interval_s=0.001, nvml=nvml)
    rows = sample_until_ready(sampler, nvml)
    assert len(rows) == 2 and not sampler.measured and "NVML stopped answering (GPU is lost)" == sampler.reason


def test_cuda_indices_map_to_nvml_through_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert [nvml_index(0), nvml_index(1)] == [3, 1]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1234abcd")
    assert nvml_index(0) == 0
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert nvml_index(2) == 2


def test_a_sampled_run_writes_gpu_and_step_samples_and_summarizes_them(tmp_path, monkeypatch):
    """The whole path on a CPU, with the sampler a CUDA run would build given the fake NVML."""
    import ddplab
    from ddplab.engine import worker

    monkeypatch.setattr(
        worker,
        "build_gpu_sampler",
        lambda config, ctx: GpuSampler([0], interval_s=0.001, nvml=FakeNVML(util=(40,), used_mib=(512,))),
    )
    result = ddplab.train(tiny_config(tmp_path / "r", train={"epochs": 2}))
    rows = [json.loads(line) for line in (tmp_path / "r" / "gpu.jsonl").read_text().splitlines()]
    assert {r["epoch"] for r in rows} == {1, 2} and {r["util_pct"] for r in rows} == {40.0}
    assert result.summary["gpu"] == {
        "measured": True,
        "reason": None,
        "per_rank": [{"rank": 0, "mean_util_pct": 40.0, "peak_mem_used_mib": 512.0}],
    }
    assert result.history[0].per_rank["gpu_util_pct"] == [40.0]
    steps = [json.loads(line) for line in (tmp_path / "r" / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, 17))  # 8 steps per epoch, each one read (fewer than 50)
    assert steps[-1]["epoch"] == 2 and steps[-1]["train_loss"] > 0 and steps[-1]["lr"] >= 0


def test_a_cpu_run_says_gpu_not_measured(tiny_run):
    result = tiny_run(train={"epochs": 1})
    assert result.summary["gpu"] == {"measured": False, "reason": "no GPU (training on the CPU)"}
    assert not (result.run_dir / "gpu.jsonl").exists() and (result.run_dir / "steps.jsonl").is_file()


def test_resume_drops_samples_of_epochs_after_the_checkpoint(tmp_path):
    from ddplab.metrics.sinks import SamplesSink

    (tmp_path / "steps.jsonl").write_text(
        "".join(json.dumps({"epoch": e, "step": e}) + "\n" for e in (1, 1, 2, 3)) + '{"epoch": 3, "ste'
    )  # and a torn last line
    SamplesSink(tmp_path, keep_through_epoch=2)
    assert [json.loads(line)["epoch"] for line in (tmp_path / "steps.jsonl").read_text().splitlines()] == [1, 1, 2]
