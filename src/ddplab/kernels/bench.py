"""`ddplab kernels bench`: the seed's kernel comparisons, measured the same way, as one table.

Two sections, each a list of row dicts (pure functions; `format_table` prints them):

Grayscale (report A): a batch of 3 x 128 x 128 uint8 images (report A resized STL-10 to
128 x 128; the pixel values do not change the time, so they are random). Rows: the
pure-Python double loop on a small sample, vectorized torch on CPU and on CUDA, the Triton
kernel and the CUDA C++ kernel. Time per image, speedup over the Python loop, and GB/s
(3 bytes read + 1 written per pixel).

Conv+ReLU (report B), forward and backward, on three shapes:
- "seed-2layer": report B's 2-layer net. Its accuracies (94% for 2 layers, 11.35% for the
  10-layer net, which is exactly the share of the digit 1 in MNIST's test set, 1135/10000)
  say it trained on MNIST, and it gives no widths, so: MNIST-sized input 1 x 28 x 28, batch
  64, Conv(1->32, 3x3) + ReLU, Conv(32->64, 3x3) + ReLU, no padding: the conv layers of
  PyTorch's MNIST example, the likeliest template.
- "seed-10layer": Conv(1->32, 3x3, pad 1) + ReLU, then ONE shared Conv(32->32, 3x3, pad 1)
  + ReLU applied 9 times ("looped one shared layer"), batch 64, 1 x 28 x 28.
- "layer-64x32": one realistic CIFAR-ResNet layer, N=128, 64->64 channels, 32 x 32, 3x3
  pad 1, whose input needs a gradient too (a middle layer).
Variants: cuDNN (cudnn.benchmark on), cuDNN disabled (PyTorch's native CUDA conv), CPU,
torch.compile (on the bench device), and FusedConvReLU (the Triton kernel). Forward is
timed with autograd recording (a training forward); backward = median(forward + backward)
- median(forward). Achieved TFLOP/s and GB/s use the FLOPs and minimum bytes of
`conv_costs` and are shown against the device's measured peaks (`measure_peaks`).

Timing (STYLE rule 11): warm-up calls first (they include cudnn.benchmark's search,
Triton's autotuning and torch.compile's compilation), then the median of `repeats` timed
runs; on CUDA each run is bracketed by CUDA events and calls the function back to back
enough times to last >= 1 ms (so launch latency is amortized as in a training loop).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ddplab.kernels.reference import conv_out_size
from ddplab.metrics.system import device_name, synchronize

GRAY_IMAGE = (3, 128, 128)

# Vendor peak figures for the roofline floors in NOTES.md (dense, no sparsity).
H100_SXM: dict[str, Any] = {
    "name": "H100 SXM",
    "bf16_tflops": 989.4,
    "tf32_tflops": 494.7,
    "fp32_tflops": 66.9,
    "hbm_gbps": 3350.0,
}


@dataclasses.dataclass(frozen=True)
class ConvLayer:
    c_in: int
    c_out: int
    kernel: int = 3
    stride: int = 1
    padding: int = 1


@dataclasses.dataclass(frozen=True)
class ConvShape:
    """A stack of conv+ReLU layers; the last layer is applied `repeat_last` times, shared."""

    name: str
    batch: int
    image: tuple[int, int, int]  # C, H, W of the input
    layers: tuple[ConvLayer, ...]
    repeat_last: int = 1
    input_grad: bool = False  # does the first layer's input need a gradient?
    note: str = ""

    def applications(self) -> list[tuple[ConvLayer, int, int]]:
        """(layer, H_in, W_in) for every conv call of one forward pass, in order."""
        layers = list(self.layers[:-1]) + [self.layers[-1]] * self.repeat_last
        out, (_, h, w) = [], self.image
        for layer in layers:
            out.append((layer, h, w))
            h = conv_out_size(h, layer.kernel, layer.stride, layer.padding, 1)
            w = conv_out_size(w, layer.kernel, layer.stride, layer.padding, 1)
        return out


CONV_SHAPES = (
    ConvShape(
        "seed-2layer",
        64,
        (1, 28, 28),
        (ConvLayer(1, 32, padding=0), ConvLayer(32, 64, padding=0)),
        note="report B 2-layer (MNIST, widths of PyTorch's MNIST example)",
    ),
    ConvShape(
        "seed-10layer",
        64,
        (1, 28, 28),
        (ConvLayer(1, 32), ConvLayer(32, 32)),
        repeat_last=9,
        note="report B 10-layer: stem + one shared 32->32 layer looped 9x",
    ),
    ConvShape(
        "layer-64x32",
        128,
        (64, 32, 32),
        (ConvLayer(64, 64),),
        input_grad=True,
        note="realistic layer: N=128, 64->64, 32x32, 3x3 pad 1",
    ),
)

CONV_VARIANTS = ("cuDNN", "cuDNN disabled", "CPU", "torch.compile", "FusedConvReLU")


# ---- costs ------------------------------------------------------------------------------


def conv_costs(shape: ConvShape, dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """FLOPs and minimum DRAM bytes of one forward and one backward pass of `shape`.

    FLOPs: 2*N*K*P*Q*C*R*S per conv call; backward = grad-weight (same) + grad-input (same,
    except for the first layer when its input needs no gradient). Minimum bytes, fused: each
    call reads its input, weights and bias and writes its output once (the pre-activation
    never leaves the chip); backward reads grad-output, the output (ReLU mask), the input and
    the weights and writes grad-input (when needed), grad-weight and grad-bias.
    """
    size = torch.empty((), dtype=dtype).element_size()
    fwd_flops = bwd_flops = fwd_bytes = bwd_bytes = 0
    for i, (layer, h, w) in enumerate(shape.applications()):
        p = conv_out_size(h, layer.kernel, layer.stride, layer.padding, 1)
        q = conv_out_size(w, layer.kernel, layer.stride, layer.padding, 1)
        n = shape.batch
        macs = n * layer.c_out * p * q * layer.c_in * layer.kernel**2
        x_el, y_el = n * layer.c_in * h * w, n * layer.c_out * p * q
        w_el = layer.c_out * layer.c_in * layer.kernel**2 + layer.c_out
        needs_grad_x = i > 0 or shape.input_grad
        fwd_flops += 2 * macs
        bwd_flops += 2 * macs * (2 if needs_grad_x else 1)
        fwd_bytes += (x_el + w_el + y_el) * size
        bwd_bytes += (2 * y_el + x_el + w_el + (x_el if needs_grad_x else 0) + w_el) * size
    return {"fwd_flops": fwd_flops, "bwd_flops": bwd_flops, "fwd_bytes": fwd_bytes, "bwd_bytes": bwd_bytes}


def roofline_floor_s(flops: float, nbytes: float, peak_tflops: float, peak_gbps: float) -> float:
    """The roofline's lower bound on time: compute-bound or memory-bound, whichever is slower."""
    return max(flops / (peak_tflops * 1e12), nbytes / (peak_gbps * 1e9))


def roofline_rows(dtype: torch.dtype = torch.float32, peaks: dict[str, Any] = H100_SXM) -> list[dict[str, Any]]:
    """Per conv shape: FLOPs, minimum bytes, arithmetic intensity and the H100 floor times."""
    key = {torch.float32: "tf32_tflops", torch.bfloat16: "bf16_tflops", torch.float16: "bf16_tflops"}[dtype]
    rows = []
    for shape in CONV_SHAPES:
        c = conv_costs(shape, dtype)
        rows.append(
            {
                "shape": shape.name,
                **c,
                "fwd_intensity": c["fwd_flops"] / c["fwd_bytes"],
                "fwd_floor_us": 1e6 * roofline_floor_s(c["fwd_flops"], c["fwd_bytes"], peaks[key], peaks["hbm_gbps"]),
                "bwd_floor_us": 1e6 * roofline_floor_s(c["bwd_flops"], c["bwd_bytes"], peaks[key], peaks["hbm_gbps"]),
            }
        )
    return rows


# ---- timing ------------------------------------------------------------------------------


def time_ms(
    fn: Callable[[], Any], device: torch.device, repeats: int, warmup: int, min_run_ms: float = 1.0, best: bool = False
) -> float:
    """Median (or, with `best`, minimum) milliseconds per call of `fn` over `repeats` timed runs,
    after `warmup` calls."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    once_ms = (time.perf_counter() - start) * 1e3
    inner = max(1, min(1000, math.ceil(min_run_ms / max(once_ms, 1e-6)))) if device.type == "cuda" else 1
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            samples.append(begin.elapsed_time(end) / inner)
        else:
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
    return min(samples) if best else statistics.median(samples)


def measure_peaks(device: torch.device, dtype: torch.dtype = torch.float32, quick: bool = False) -> dict[str, Any]:
    """Measured peak matmul TFLOP/s (at the math mode convs use) and copy GB/s on `device`.

    Peaks are the best of the timed runs (a peak is what the device can do, not what it did
    on average); the rows are medians.

    fp32 matmuls are allowed TF32 exactly when cuDNN convs are (torch.backends.cudnn.allow_tf32),
    so the compute peak is the one the conv rows could reach.
    """
    cuda = device.type == "cuda"
    # quick on a CPU: 512 (a 1024 bf16 matmul takes 2 s where the CPU has no bf16 units; quick checks plumbing)
    n = (8192 if not quick else 4096) if cuda else (1024 if not quick else 512)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32
    try:
        mm_ms = time_ms(lambda: a @ b, device, repeats=5 if quick else 10, warmup=2, best=True)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    elems = (1024 if cuda else 64) * 2**20 // (4 if quick else 1)
    src = torch.empty(elems, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    copy_ms = time_ms(lambda: dst.copy_(src), device, repeats=5 if quick else 10, warmup=2, best=True)
    return {
        "tflops": 2 * n**3 / (mm_ms * 1e-3) / 1e12,
        "gbps": 2 * elems / (copy_ms * 1e-3) / 1e9,
        "how": f"{n}x{n} {str(dtype).removeprefix('torch.')} matmul; {elems >> 20} MiB copy (read+write)",
    }


# ---- grayscale rows ----------------------------------------------------------------------


def _gray_row(variant: str, device: str, **fields: Any) -> dict[str, Any]:
    case = "x".join(map(str, GRAY_IMAGE)) + " uint8"
    return {"section": "grayscale", "case": case, "variant": variant, "device": device, **fields}


def gray_rows(
    device: torch.device, *, num_images: int = 200, loop_images: int = 2, repeats: int = 10, quick: bool = False
) -> list[dict[str, Any]]:
    """Report A's comparison: per-image time of each grayscale implementation, and speedups."""
    from ddplab.kernels import rgb_to_gray as gray_fn
    from ddplab.kernels.rgb_to_gray import unavailable_reason

    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (num_images, *GRAY_IMAGE), dtype=torch.uint8, generator=gen)
    pixels = GRAY_IMAGE[1] * GRAY_IMAGE[2]
    cpu = torch.device("cpu")
    rows = []
    plan = [
        ("python_loop", "python_loop", cpu),
        ("torch CPU", "torch", cpu),
        ("torch CUDA", "torch", device),
        ("triton", "triton", device),
        ("cuda C++", "cuda", device),
    ]
    for variant, impl, dev in plan:
        if variant != "torch CPU" and variant != "python_loop" and dev.type != "cuda":
            reason = unavailable_reason(impl, "cuda") or (
                "run with --device cuda" if torch.cuda.is_available() else "needs a CUDA GPU"
            )
            rows.append(_gray_row(variant, "cuda", status="needs GPU", reason=reason))
            continue
        count = loop_images if impl == "python_loop" else num_images
        batch = images[:count].to(dev)
        try:
            reps, warm = (1, 0) if impl == "python_loop" else (repeats, 3)
            ms = time_ms(functools.partial(gray_fn, batch, impl=impl), dev, reps, warm)
        except Exception as exc:  # a row that fails (e.g. nvcc missing) must not sink the table
            rows.append(_gray_row(variant, dev.type, status="error", reason=f"{type(exc).__name__}: {exc}"))
            continue
        per_image_s = ms / 1e3 / count
        rows.append(
            _gray_row(
                variant,
                dev.type,
                status="ok",
                images=count,
                us_per_image=per_image_s * 1e6,
                gbps=4 * pixels / per_image_s / 1e9,
            )
        )
    loop = next((r for r in rows if r["variant"] == "python_loop" and r["status"] == "ok"), None)
    for row in rows:
        if loop is not None and row["status"] == "ok":
            row["speedup"] = loop["us_per_image"] / row["us_per_image"]
    return rows


# ---- conv + ReLU rows --------------------------------------------------------------------


def build_net(shape: ConvShape, device: torch.device, dtype: torch.dtype) -> nn.Sequential:
    """Conv2d + ReLU modules of `shape` (seeded: every variant gets the same weights)."""
    torch.manual_seed(0)
    modules: list[nn.Module] = []
    convs = [nn.Conv2d(c.c_in, c.c_out, c.kernel, c.stride, c.padding) for c in shape.layers]
    for conv in convs[:-1] + [convs[-1]] * shape.repeat_last:
        modules += [conv, nn.ReLU()]
    return nn.Sequential(*modules).to(device=device, dtype=dtype)


def _variant_setup(variant: str, device: torch.device) -> tuple[torch.device, str | None]:
    """(device the variant runs on, None or why it cannot run here)."""
    if variant == "CPU":
        return torch.device("cpu"), None
    if variant in ("cuDNN", "cuDNN disabled"):
        return torch.device("cuda"), None if device.type == "cuda" else "needs a CUDA GPU"
    if variant == "FusedConvReLU":
        if device.type != "cuda":
            return torch.device("cuda"), (
                "needs a CUDA GPU (on CPU the Triton kernel only runs in the "
                "NumPy interpreter: a correctness check, not a timing)"
            )
        from ddplab.kernels.conv_relu import triton_unavailable_reason

        return device, triton_unavailable_reason(device)
    return device, None  # torch.compile runs on the bench device


def _conv_callables(shape: ConvShape, variant: str, device: torch.device, dtype: torch.dtype):
    net = build_net(shape, device, dtype)
    if variant == "FusedConvReLU":
        from ddplab.kernels import fuse_conv_relu

        assert fuse_conv_relu(net, backend="triton") == len(shape.applications())
    if variant == "torch.compile":
        net = torch.compile(net)  # type: ignore[assignment]
    params = list(net.parameters())
    gen = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn((shape.batch, *shape.image), generator=gen).to(device=device, dtype=dtype)
    x.requires_grad_(shape.input_grad)
    y = net(x)
    grad = torch.ones_like(y)

    def forward():
        return net(x)

    def forward_backward():
        for p in params:
            p.grad = None
        x.grad = None
        net(x).backward(grad)

    return forward, forward_backward


def conv_rows(
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    *,
    repeats: int = 10,
    warmup: int = 3,
    shapes: tuple[ConvShape, ...] = CONV_SHAPES,
    variants: tuple[str, ...] = CONV_VARIANTS,
    peaks: dict[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Forward/backward time of each Conv+ReLU variant on each shape, with achieved rates.

    `peaks` maps a device type ("cpu", "cuda") to `measure_peaks` output; rows on a device
    with a peak get %-of-peak columns.
    """
    rows = []
    for shape in shapes:
        costs = conv_costs(shape, dtype)
        for variant in variants:
            dev, reason = _variant_setup(variant, device)
            row: dict[str, Any] = {"section": "conv_relu", "case": shape.name, "variant": variant, "device": dev.type}
            if reason is not None:
                rows.append({**row, "status": "needs GPU" if "GPU" in reason else "skipped", "reason": reason})
                continue
            try:
                with torch.backends.cudnn.flags(
                    enabled=variant != "cuDNN disabled",
                    benchmark=True,
                    deterministic=False,
                    allow_tf32=torch.backends.cudnn.allow_tf32,
                ):
                    forward, forward_backward = _conv_callables(shape, variant, dev, dtype)
                    fwd_ms = time_ms(forward, dev, repeats, warmup)
                    step_ms = time_ms(forward_backward, dev, repeats, warmup)
            except Exception as exc:
                rows.append({**row, "status": "error", "reason": f"{type(exc).__name__}: {exc}"[:200]})
                continue
            bwd_ms = max(step_ms - fwd_ms, 1e-9)
            row.update(
                status="ok",
                fwd_ms=fwd_ms,
                bwd_ms=bwd_ms,
                fwd_tflops=costs["fwd_flops"] / (fwd_ms * 1e-3) / 1e12,
                fwd_gbps=costs["fwd_bytes"] / (fwd_ms * 1e-3) / 1e9,
                bwd_tflops=costs["bwd_flops"] / (bwd_ms * 1e-3) / 1e12,
            )
            peak = (peaks or {}).get(dev.type)
            if peak:
                row.update(
                    fwd_pct_flops=100 * row["fwd_tflops"] / peak["tflops"],
                    fwd_pct_bw=100 * row["fwd_gbps"] / peak["gbps"],
                )
            rows.append(row)
    return rows


# ---- everything --------------------------------------------------------------------------


def run_bench(
    device: str = "auto", *, repeats: int = 10, quick: bool = False, dtype: torch.dtype = torch.float32
) -> dict[str, Any]:
    """All rows plus the context needed to read them (device names, peaks, settings)."""
    dev = torch.device(
        "cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device)
    )
    if quick:
        repeats = min(repeats, 3)
    peaks = {"cpu": measure_peaks(torch.device("cpu"), dtype, quick=quick)}
    if dev.type == "cuda":
        peaks["cuda"] = measure_peaks(dev, dtype, quick=quick)
    variants: tuple[str, ...] = CONV_VARIANTS
    if quick and dev.type == "cpu":
        variants = tuple(v for v in CONV_VARIANTS if v != "torch.compile")
    rows = gray_rows(dev, num_images=20 if quick else 200, loop_images=1 if quick else 2, repeats=repeats)
    rows += conv_rows(
        dev, dtype, repeats=repeats, warmup=1 if quick else 3, shapes=CONV_SHAPES, variants=variants, peaks=peaks
    )
    if quick and dev.type == "cpu":
        rows += [
            {
                "section": "conv_relu",
                "case": s.name,
                "variant": "torch.compile",
                "device": "cpu",
                "status": "skipped",
                "reason": "--quick on CPU skips compilation (tens of seconds)",
            }
            for s in CONV_SHAPES
        ]
    return {
        "device": device_name(dev),
        "cpu": device_name(torch.device("cpu")),
        "torch": torch.__version__,
        "triton": _triton_version(),
        "dtype": str(dtype).removeprefix("torch."),
        "repeats": repeats,
        "quick": quick,
        "peaks": peaks,
        "rows": rows,
    }


def _triton_version() -> str | None:
    from ddplab.kernels._runtime import triton_installed

    if not triton_installed():
        return None
    import triton

    return triton.__version__


def _num(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}" if value >= 0.01 else f"{value:.2g}"


def format_table(result: dict[str, Any]) -> str:
    """The bench result as aligned text tables (one per section), then the rows that need a GPU."""
    lines = [
        f"device: {result['device']} | torch {result['torch']} | triton {result['triton'] or 'not installed'}"
        f" | {result['dtype']} | median of {result['repeats']} runs after warm-up"
    ]
    for dev, p in result["peaks"].items():
        lines.append(f"measured peak {dev}: {p['tflops']:.3g} TFLOP/s, {p['gbps']:.3g} GB/s ({p['how']})")
    rows = result["rows"]
    ok = [r for r in rows if r["status"] == "ok"]
    gray = [r for r in ok if r["section"] == "grayscale"]
    if gray:
        lines += [
            "",
            f"RGB->gray, {'x'.join(map(str, GRAY_IMAGE))} uint8 "
            "(report A at 3x128x128: python loop 1.03 s/image, CUDA kernel 0.9 ms/image)",
            f"{'variant':<14}{'device':<7}{'images':>7}{'us/image':>12}{'speedup':>10}{'GB/s':>9}",
        ]
        for r in gray:
            lines.append(
                f"{r['variant']:<14}{r['device']:<7}{r['images']:>7}{_num(r['us_per_image']):>12}"
                f"{_num(r.get('speedup')) + 'x':>10}{_num(r['gbps']):>9}"
            )
    conv = [r for r in ok if r["section"] == "conv_relu"]
    if conv:
        lines += [
            "",
            "Conv+ReLU forward / backward (backward = fwd+bwd step - fwd)",
            f"{'shape':<14}{'variant':<16}{'device':<7}{'fwd ms':>9}{'bwd ms':>9}{'fwd TFLOP/s':>12}"
            f"{'%peak':>7}{'fwd GB/s':>10}{'%peak':>7}{'bwd TFLOP/s':>12}",
        ]
        for r in conv:
            lines.append(
                f"{r['case']:<14}{r['variant']:<16}{r['device']:<7}{_num(r['fwd_ms'], 3):>9}"
                f"{_num(r['bwd_ms'], 3):>9}{_num(r['fwd_tflops'], 3):>12}{_num(r.get('fwd_pct_flops'), 1):>7}"
                f"{_num(r['fwd_gbps']):>10}{_num(r.get('fwd_pct_bw'), 1):>7}{_num(r['bwd_tflops'], 3):>12}"
            )
    other = [r for r in rows if r["status"] != "ok"]
    if other:
        lines += ["", "not measured here:"]
        for r in other:
            lines.append(f"  [{r['status']}] {r['section']} {r['case']} / {r['variant']}: {r['reason']}")
    lines += ["", "shapes: " + "; ".join(f"{s.name} = {s.note}" for s in CONV_SHAPES)]
    return "\n".join(lines)
