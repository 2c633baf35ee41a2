"""The Triton kernels: RGB -> grayscale, and Conv2d + bias + ReLU as one implicit-GEMM kernel.

Imported lazily (see `_runtime`): `triton.jit` picks compiled or interpreted at import
time, and INTERPRETED records which. Callers go through `rgb_to_gray.py` / `conv_relu.py`,
which validate arguments; the launchers here only check what the kernels rely on.

Conv as implicit GEMM (no im2col buffer in memory): the output y[n, k, p, q] is the
product of an M x CRS matrix A (M = N*P*Q output pixels, CRS = C*R*S filter taps, A[m, j]
the input pixel that tap j of output pixel m reads, 0 in the padding) and a CRS x K matrix
B (the weights). Each program computes one BLOCK_M x BLOCK_N tile of y: it gathers tiles of
A straight from x, loads tiles of B from the weights, accumulates in fp32 with `tl.dot`
(tensor cores for bf16/fp16, TF32 for fp32 when cuDNN is allowed TF32, as PyTorch's convs
are by default), and in the epilogue adds the bias, applies ReLU, casts and stores: the
pre-activation never reaches global memory. The tap index j runs channel-fastest,
j = (r*S + s)*C + c, so that a channels_last input is read contiguously along j; any
strides work (NCHW or NHWC input, the output takes the input's memory format).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from ddplab.kernels._runtime import interpret_requested
from ddplab.kernels.reference import GRAY_SCALE, GRAY_WEIGHTS_E4

# triton.knobs (3.4+) is what triton.jit itself reads; older 3.x read the variable directly.
INTERPRETED: bool = bool(triton.knobs.runtime.interpret) if hasattr(triton, "knobs") else interpret_requested()

# Compiled @triton.jit code may read module globals only when they are tl.constexpr.
_W_R, _W_G, _W_B = (tl.constexpr(w) for w in GRAY_WEIGHTS_E4)
_HALF = tl.constexpr(GRAY_SCALE // 2)
_SCALE = tl.constexpr(GRAY_SCALE)

# ---------------------------------------------------------------------------- grayscale


@triton.jit
def _rgb_to_gray_kernel(
    x_ptr,
    y_ptr,
    HW,
    stride_xn,
    stride_yn,
    IS_UINT8: tl.constexpr,
    COMPUTE_F64: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # grid = (N, cdiv(H*W, BLOCK)): one lane per output pixel, planes contiguous (C, H*W). The
    # batch goes on axis 0, whose limit is 2**31 - 1 programs (axis 1 allows only 65535).
    n = tl.program_id(0).to(tl.int64)
    pid = tl.program_id(1)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < HW
    src = x_ptr + n * stride_xn
    r = tl.load(src + offs, mask=mask, other=0)
    g = tl.load(src + HW + offs, mask=mask, other=0)
    b = tl.load(src + 2 * HW + offs, mask=mask, other=0)
    if IS_UINT8:
        # Exact integer round-half-up of (2989 R + 5870 G + 1140 B) / 10000, as the reference.
        acc = r.to(tl.int32) * _W_R + g.to(tl.int32) * _W_G + b.to(tl.int32) * _W_B + _HALF
        out = tl.minimum(acc // _SCALE, 255).to(tl.uint8)
    else:
        # Integer weights over 10000 are exact in fp32/fp64, unlike the literal 0.2989.
        if COMPUTE_F64:
            r = r.to(tl.float64)
            g = g.to(tl.float64)
            b = b.to(tl.float64)
        else:
            r = r.to(tl.float32)
            g = g.to(tl.float32)
            b = b.to(tl.float32)
        out = ((r * _W_R + g * _W_G + b * _W_B) / _SCALE).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + n * stride_yn + offs, out, mask=mask)


def rgb_to_gray(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Gray of a contiguous (N, 3, H, W) or (3, H, W) tensor; `out` (tests) must be contiguous."""
    assert x.is_contiguous() and x.shape[-3] == 3, "caller makes x contiguous and checks it"
    batch = x if x.dim() == 4 else x.unsqueeze(0)
    n, _, h, w = batch.shape
    shape = (*x.shape[:-3], h, w)
    y = torch.empty(shape, dtype=x.dtype, device=x.device) if out is None else out
    assert y.shape == shape and y.is_contiguous() and y.dtype == x.dtype
    if y.numel() == 0:
        return y
    block = 1024
    grid = (n, triton.cdiv(h * w, block))
    _rgb_to_gray_kernel[grid](
        batch,
        y,
        h * w,
        3 * h * w,
        h * w,
        IS_UINT8=x.dtype == torch.uint8,
        COMPUTE_F64=x.dtype == torch.float64,
        BLOCK=block,
    )
    return y


# ---------------------------------------------------------------------------- conv + ReLU


@triton.jit
def _conv_relu_fwd_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    N,
    C,
    H,
    W,
    K,
    P,
    Q,
    stride_xn,
    stride_xc,
    stride_xh,
    stride_xw,
    stride_wk,
    stride_wc,
    stride_wr,
    stride_ws,
    stride_yn,
    stride_yk,
    stride_yp,
    stride_yq,
    conv_stride_h,
    conv_stride_w,
    pad_h,
    pad_w,
    dil_h,
    dil_w,
    R: tl.constexpr,
    S: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    M = N * P * Q
    CRS = C * R * S
    # Grouped tile order: GROUP_M row-tiles share each column of weight tiles while in L2.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(K, BLOCK_N)
    group_size = GROUP_M * num_pid_n
    first_m = (pid // group_size) * GROUP_M
    rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group_size) % rows
    pid_n = (pid % group_size) // rows

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < K
    # Output pixel m -> (image, row, column), and the top-left input pixel its window reads.
    img = offs_m // (P * Q)
    pq = offs_m % (P * Q)
    ih0 = (pq // Q) * conv_stride_h - pad_h
    iw0 = (pq % Q) * conv_stride_w - pad_w
    x_row = x_ptr + img.to(tl.int64) * stride_xn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for j0 in range(0, CRS, BLOCK_K):
        offs_j = j0 + tl.arange(0, BLOCK_K)
        j_mask = offs_j < CRS
        c = offs_j % C
        rs = offs_j // C
        r = rs // S
        s = rs % S
        ih = ih0[:, None] + r[None, :] * dil_h
        iw = iw0[:, None] + s[None, :] * dil_w
        a_mask = m_mask[:, None] & j_mask[None, :] & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
        a_ptrs = x_row[:, None] + c[None, :] * stride_xc + ih * stride_xh + iw * stride_xw
        a = tl.load(a_ptrs, mask=a_mask, other=0.0)
        b_ptrs = (
            w_ptr
            + offs_n[None, :] * stride_wk
            + c[:, None] * stride_wc
            + r[:, None] * stride_wr
            + s[:, None] * stride_ws
        )
        b = tl.load(b_ptrs, mask=j_mask[:, None] & n_mask[None, :], other=0.0)
        if UPCAST_DOT:
            # The interpreter multiplies with NumPy, which has no bf16; a bf16 x bf16 product
            # is exact in fp32, so this changes nothing but the summation order.
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)

    if HAS_BIAS:
        bias = tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
    acc = tl.maximum(acc, 0.0)
    y_ptrs = (
        y_ptr
        + img.to(tl.int64)[:, None] * stride_yn
        + offs_n[None, :] * stride_yk
        + (pq // Q)[:, None] * stride_yp
        + (pq % Q)[:, None] * stride_yq
    )
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def _tile_configs() -> list[triton.Config]:
    """A few tile shapes for autotuning on the GPU; small K/N tiles suit narrow CNN layers."""
    shapes = [  # BLOCK_M, BLOCK_N, BLOCK_K, warps, stages
        (128, 128, 32, 8, 3),
        (128, 64, 32, 4, 4),
        (64, 128, 32, 4, 4),
        (128, 32, 32, 4, 4),
        (64, 64, 32, 4, 4),
        (64, 32, 32, 4, 4),
        (128, 64, 64, 8, 3),
        (256, 64, 32, 8, 3),
        (64, 16, 16, 2, 4),
        (128, 16, 32, 4, 4),
    ]
    return [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8}, num_warps=w, num_stages=s)
        for m, n, k, w, s in shapes
    ]


# The interpreter runs one fixed, small tile (autotuning there would only multiply the
# runtime); compiled kernels are autotuned per layer shape on first use (excluded from timing
# by the benchmark's warm-up).
_INTERPRETER_TILE = {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 4}
_conv_relu_fwd_tuned: Any = (
    triton.autotune(configs=_tile_configs(), key=["N", "C", "H", "W", "K", "P", "Q", "R", "S"])(_conv_relu_fwd_kernel)
    if not INTERPRETED
    else None
)


def output_memory_format(x: torch.Tensor) -> torch.memory_format:
    """channels_last when x is (strictly) channels_last, else contiguous: what F.conv2d picks."""
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def conv_relu_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """relu(conv2d(x, weight, bias)) for 4-D x, groups=1, in one kernel launch."""
    n, c, h, w = x.shape
    k, _, r, s = weight.shape
    p = (h + 2 * padding[0] - dilation[0] * (r - 1) - 1) // stride[0] + 1
    q = (w + 2 * padding[1] - dilation[1] * (s - 1) - 1) // stride[1] + 1
    if out is None:
        out = torch.empty((n, k, p, q), dtype=x.dtype, device=x.device, memory_format=output_memory_format(x))
    assert out.shape == (n, k, p, q) and out.dtype == x.dtype
    if out.numel() == 0:
        return out
    if c * r * s == 0:  # no taps: the output is relu(bias)
        return out.copy_(torch.relu(bias).view(1, k, 1, 1).expand_as(out)) if bias is not None else out.zero_()
    bias = bias.contiguous() if bias is not None else None  # the kernel reads it with stride 1
    precision = "tf32" if x.dtype == torch.float32 and torch.backends.cudnn.allow_tf32 else "ieee"
    args = (
        x,
        weight,
        bias if bias is not None else weight,
        out,
        n,
        c,
        h,
        w,
        k,
        p,
        q,
        *x.stride(),
        *weight.stride(),
        *out.stride(),
        stride[0],
        stride[1],
        padding[0],
        padding[1],
        dilation[0],
        dilation[1],
    )
    consts = dict(R=r, S=s, HAS_BIAS=bias is not None, UPCAST_DOT=INTERPRETED, PRECISION=precision)
    m = n * p * q
    grid: Any
    if INTERPRETED:
        tile = _INTERPRETER_TILE
        grid = (triton.cdiv(m, tile["BLOCK_M"]) * triton.cdiv(k, tile["BLOCK_N"]),)
        _conv_relu_fwd_kernel[grid](*args, **consts, **tile)
    else:

        def grid(meta):
            return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(k, meta["BLOCK_N"]),)

        _conv_relu_fwd_tuned[grid](*args, **consts)
    return out
