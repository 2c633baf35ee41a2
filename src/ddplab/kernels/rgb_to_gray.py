"""RGB -> grayscale, four ways behind one function: `rgb_to_gray(x, impl="torch")`.

Gray = 0.2989 R + 0.5870 G + 0.1140 B (seed report A). Input: uint8 or float, 3 x H x W or
N x 3 x H x W (planar RGB, any strides: it is made contiguous first). Output: H x W or
N x H x W in the input's dtype; uint8 is rounded half up and clamped, floats are not clamped.
Every impl matches `reference.rgb_to_gray_reference` (bit for bit for uint8; see there why).

- "python_loop": the seed's pure-Python double loop over pixels, for the lesson (slow);
- "torch": vectorized PyTorch, any device;
- "triton": one Triton kernel (CUDA, or CPU under TRITON_INTERPRET=1);
- "cuda": CUDA C++ built with load_inline, one thread per pixel (CUDA only).

The op is registered as `torch.ops.ddplab.rgb_to_gray` (custom_op + register_fake +
register_autograd, STYLE rule 14), so torch.compile treats it as one opaque node and float
inputs get gradients (gray is linear: d gray / d channel = that channel's weight).
"""

from __future__ import annotations

import torch

from ddplab.kernels import _runtime
from ddplab.kernels.reference import GRAY_SCALE, GRAY_WEIGHTS, GRAY_WEIGHTS_E4, check_rgb, gray_shape

IMPLS = ("python_loop", "torch", "triton", "cuda")


def unavailable_reason(impl: str, device: torch.device | str) -> str | None:
    """None when `impl` can run on tensors of `device`, else why not."""
    if impl not in IMPLS:
        raise ValueError(f"unknown rgb_to_gray impl {impl!r}: choose one of {', '.join(IMPLS)}")
    device = torch.device(device)
    if impl == "triton":
        return _runtime.triton_unavailable_reason(device)
    if impl == "cuda":
        return _runtime.cuda_unavailable_reason() or (
            None if device.type == "cuda" else f"the CUDA C++ kernel needs a CUDA tensor, got {device.type}"
        )
    return None


def rgb_to_gray(x: torch.Tensor, impl: str = "torch") -> torch.Tensor:
    """Grayscale of planar RGB `x` with implementation `impl` (see the module docstring).

    Raises ValueError for a bad shape/dtype/impl and RuntimeError when `impl` cannot run
    here (no triton, no GPU, ...), with the reason.
    """
    check_rgb(x)
    reason = unavailable_reason(impl, x.device)
    if reason is not None:
        raise RuntimeError(f"rgb_to_gray impl={impl!r} is unavailable: {reason}")
    return torch.ops.ddplab.rgb_to_gray(x, impl)


# ---- implementations (x already checked) --------------------------------------------------


def _python_loop(x: torch.Tensor) -> torch.Tensor:
    # The seed's double loop over rows and columns, on Python numbers (one list per plane).
    images = x.reshape(-1, 3, *x.shape[-2:]).cpu().tolist()
    w_r, w_g, w_b = GRAY_WEIGHTS_E4
    is_uint8 = x.dtype == torch.uint8
    out = []
    for red, green, blue in images:
        gray = []
        for i in range(len(red)):
            row = []
            for j in range(len(red[i])):
                v = w_r * red[i][j] + w_g * green[i][j] + w_b * blue[i][j]
                row.append(min((v + GRAY_SCALE // 2) // GRAY_SCALE, 255) if is_uint8 else v / GRAY_SCALE)
            gray.append(row)
        out.append(gray)
    return torch.tensor(out, dtype=x.dtype).reshape(gray_shape(x)).to(x.device)


def _torch(x: torch.Tensor) -> torch.Tensor:
    r, g, b = x.unbind(-3)
    w_r, w_g, w_b = GRAY_WEIGHTS_E4
    if x.dtype == torch.uint8:
        v = w_r * r.to(torch.int32) + w_g * g.to(torch.int32) + w_b * b.to(torch.int32) + GRAY_SCALE // 2
        return torch.clamp_max(v // GRAY_SCALE, 255).to(torch.uint8)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    v = w_r * r.to(acc) + w_g * g.to(acc) + w_b * b.to(acc)
    return (v / GRAY_SCALE).to(x.dtype)


def _triton(x: torch.Tensor) -> torch.Tensor:
    from ddplab.kernels import _triton as kernels

    return kernels.rgb_to_gray(x.contiguous())


def _cuda(x: torch.Tensor) -> torch.Tensor:
    from ddplab.kernels import _cuda as kernels

    return kernels.rgb_to_gray(x.contiguous())


_DISPATCH = {"python_loop": _python_loop, "torch": _torch, "triton": _triton, "cuda": _cuda}


# ---- the registered op ---------------------------------------------------------------------


# The schema is written out: torch 2.4 cannot infer it from string annotations (see compat.py).
@torch.library.custom_op("ddplab::rgb_to_gray", mutates_args=(), schema="(Tensor x, str impl) -> Tensor")
def _rgb_to_gray_op(x: torch.Tensor, impl: str) -> torch.Tensor:
    return _DISPATCH[impl](x)


@_rgb_to_gray_op.register_fake
def _(x: torch.Tensor, impl: str) -> torch.Tensor:
    return x.new_empty(gray_shape(x))


def _setup_context(ctx, inputs, output) -> None:
    pass  # the gradient needs nothing saved: gray is linear in x


def _backward(ctx, grad: torch.Tensor):
    weights = torch.tensor(GRAY_WEIGHTS, dtype=grad.dtype, device=grad.device).view(3, 1, 1)
    return grad.unsqueeze(-3) * weights, None


_rgb_to_gray_op.register_autograd(_backward, setup_context=_setup_context)
