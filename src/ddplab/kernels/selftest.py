"""`ddplab kernels check`: run each implementation once on small inputs against the reference.

Each result is {"name", "status": "ok" | "skipped" | "FAILED", "detail"}; "skipped" carries
the reason the implementation cannot run here (no triton, no GPU, ...). The shapes are odd
and tiny so that the Triton interpreter finishes in seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ddplab.kernels import conv_relu, rgb_to_gray
from ddplab.kernels.reference import conv_relu_reference, rgb_to_gray_reference

GRAY = "ddplab.kernels.rgb_to_gray"


def _result(name: str, status: str, detail: str) -> dict[str, Any]:
    return {"name": name, "status": status, "detail": detail}


def check_gray(impl: str, device: torch.device) -> dict[str, Any]:
    import importlib

    module = importlib.import_module(GRAY)
    name = f"rgb_to_gray[{impl}]"
    reason = module.unavailable_reason(impl, device)
    if reason is not None:
        return _result(name, "skipped", reason)
    gen = torch.Generator().manual_seed(0)
    u8 = torch.randint(0, 256, (2, 3, 9, 7), dtype=torch.uint8, generator=gen).to(device)
    f32 = torch.rand((3, 5, 11), generator=gen).to(device)
    got_u8, got_f32 = rgb_to_gray(u8, impl=impl), rgb_to_gray(f32, impl=impl)
    mismatched = int((got_u8 != rgb_to_gray_reference(u8)).sum())
    err = float((got_f32.double() - rgb_to_gray_reference(f32.double())).abs().max())
    if mismatched or err > 1e-6:
        return _result(name, "FAILED", f"{mismatched} uint8 pixels differ, float32 max error {err:.2e}")
    return _result(name, "ok", f"uint8 exact, float32 max error {err:.1e}")


def check_conv(backend: str, device: torch.device) -> dict[str, Any]:
    name = f"conv_relu[{backend}]"
    if backend == "triton":
        reason = conv_relu.triton_unavailable_reason(device)
        if reason is not None:
            return _result(name, "skipped", reason)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((2, 5, 9, 11), generator=gen).to(device).requires_grad_()
    w = torch.randn((7, 5, 3, 3), generator=gen).to(device).requires_grad_()
    b = torch.randn((7,), generator=gen).to(device).requires_grad_()
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False  # compare full fp32 against full fp32
    try:
        y = conv_relu.fused_conv_relu(x, w, b, stride=2, padding=1, backend=backend)
        grads = torch.autograd.grad(y.square().sum(), (x, w, b))
        ref = conv_relu_reference(x, w, b, (2, 2), (1, 1), (1, 1))
        ref_grads = torch.autograd.grad(ref.square().sum(), (x, w, b))
    finally:
        torch.backends.cudnn.allow_tf32 = old
    pairs = zip((y.detach(), *grads), (ref.detach(), *ref_grads), strict=True)
    errors = [float((a - r).abs().max() / (r.abs().max() + 1)) for a, r in pairs]
    if max(errors) > 1e-4:
        return _result(name, "FAILED", f"relative errors y/dx/dw/db: {', '.join(f'{e:.1e}' for e in errors)}")
    return _result(name, "ok", f"forward+backward vs F.conv2d+relu, max relative error {max(errors):.1e}")


def check_fuse(device: torch.device) -> dict[str, Any]:
    from ddplab.kernels import fuse_conv_relu
    from ddplab.models import create_model

    torch.manual_seed(0)
    model = create_model("simple_cnn", num_classes=3, image_size=8, width=0.25, dropout=0.0).to(device).eval()
    x = torch.randn(2, 3, 8, 8, device=device)
    expected = model(x)
    count = fuse_conv_relu(model, backend="reference")
    if count != 3 or not torch.equal(model(x), expected):
        return _result("fuse_conv_relu", "FAILED", f"fused {count} pairs (expected 3) or outputs changed")
    return _result("fuse_conv_relu", "ok", "simple_cnn: 3 pairs fused, identical outputs (reference backend)")


def run_checks(device: torch.device) -> list[dict[str, Any]]:
    """Every implementation of both ops on `device`, plus the model fusion pass."""
    results = []
    jobs: list[tuple[Callable[..., dict[str, Any]], tuple[Any, ...]]] = [
        (check_gray, (impl, device)) for impl in ("python_loop", "torch", "triton", "cuda")
    ]
    jobs += [(check_conv, (backend, device)) for backend in ("reference", "triton")]
    jobs.append((check_fuse, (device,)))
    for fn, args in jobs:
        try:
            results.append(fn(*args))
        except Exception as exc:  # report and go on: one broken kernel must not hide the others
            label = f"{fn.__name__.removeprefix('check_')}{list(args[:-1])}"
            results.append(_result(label, "FAILED", f"{type(exc).__name__}: {exc}"[:300]))
    return results


__all__ = ["run_checks"]
