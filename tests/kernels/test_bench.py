"""The bench's arithmetic (FLOPs, bytes, roofline) and a tiny end-to-end run on CPU."""

import torch

from ddplab.kernels import bench
from ddplab.kernels.cli import main

TINY = bench.ConvShape(
    "tiny", 2, (3, 8, 8), (bench.ConvLayer(3, 4), bench.ConvLayer(4, 4)), repeat_last=2, note="test shape"
)


def test_conv_costs_of_the_realistic_layer():
    shape = next(s for s in bench.CONV_SHAPES if s.name == "layer-64x32")
    costs = bench.conv_costs(shape, torch.float32)
    macs = 128 * 64 * 32 * 32 * 64 * 9
    assert costs["fwd_flops"] == 2 * macs
    assert costs["bwd_flops"] == 4 * macs  # grad-input and grad-weight: its input needs a gradient
    act, weights = 128 * 64 * 32 * 32, 64 * 64 * 9 + 64
    assert costs["fwd_bytes"] == 4 * (2 * act + weights)
    assert costs["bwd_bytes"] == 4 * (2 * act + act + weights + act + weights)


def test_shared_layer_counts_every_application_and_first_layer_needs_no_grad_input():
    seed10 = next(s for s in bench.CONV_SHAPES if s.name == "seed-10layer")
    assert len(seed10.applications()) == 10
    stem = 2 * 64 * 32 * 28 * 28 * 1 * 9
    body = 2 * 64 * 32 * 28 * 28 * 32 * 9
    costs = bench.conv_costs(seed10)
    assert costs["fwd_flops"] == stem + 9 * body
    assert costs["bwd_flops"] == stem + 9 * 2 * body
    seed2 = bench.CONV_SHAPES[0].applications()
    assert [(layer.c_in, layer.c_out, h) for layer, h, _ in seed2] == [(1, 32, 28), (32, 64, 26)]


def test_roofline_rows_give_h100_floors():
    rows = bench.roofline_rows(torch.float32)
    assert [r["shape"] for r in rows] == [s.name for s in bench.CONV_SHAPES]
    layer = rows[-1]
    expected = max(layer["fwd_flops"] / 494.7e12, layer["fwd_bytes"] / 3350e9) * 1e6
    assert abs(layer["fwd_floor_us"] - expected) < 1e-9


def test_conv_rows_on_cpu_measure_cpu_and_name_gpu_rows():
    rows = bench.conv_rows(
        torch.device("cpu"), repeats=2, warmup=1, shapes=(TINY,), variants=("CPU", "cuDNN", "FusedConvReLU")
    )
    by_variant = {r["variant"]: r for r in rows}
    cpu = by_variant["CPU"]
    assert cpu["status"] == "ok" and cpu["fwd_ms"] > 0 and cpu["bwd_ms"] > 0 and cpu["fwd_tflops"] > 0
    if not torch.cuda.is_available():
        assert by_variant["cuDNN"]["status"] == "needs GPU"
        assert by_variant["FusedConvReLU"]["status"] == "needs GPU"


def test_cli_bench_quick_prints_the_table(monkeypatch, capsys):
    monkeypatch.setattr(bench, "CONV_SHAPES", (TINY,))
    monkeypatch.setattr(bench, "GRAY_IMAGE", (3, 16, 16))
    assert main(["bench", "--quick", "--device", "cpu", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert "RGB->gray, 3x16x16 uint8" in out and "python_loop" in out and "torch CPU" in out
    assert "Conv+ReLU forward / backward" in out and "tiny" in out
    assert "[needs GPU] conv_relu tiny / cuDNN" in out
    assert "[needs GPU] grayscale 3x16x16 uint8 / cuda C++" in out
    assert "[needs GPU] conv_relu tiny / FusedConvReLU" in out
