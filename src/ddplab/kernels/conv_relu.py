"""Fused Conv2d + ReLU: one Triton kernel forward, PyTorch's conv gradients backward.

`fused_conv_relu(x, weight, bias, stride, padding, dilation)` computes
relu(conv2d(x, weight, bias)) (groups=1, zero padding) and `FusedConvReLU` is the matching
drop-in module for an nn.Conv2d followed by nn.ReLU.

Which path runs (`backend`):
- "reference": relu(F.conv2d(...)), pure PyTorch, any device and dtype;
- "triton": the fused kernel of `_triton.py`; raises when it cannot run here;
- "auto" (default): "triton" when `_runtime.triton_unavailable_reason(x.device)` is None
  (CUDA tensor, or CPU tensor with TRITON_INTERPRET=1 set before the first call) and x is
  fp32/fp16/bf16; "reference" otherwise (no triton, CPU without the interpreter, float64,
  other devices). So a model fused with `fuse_conv_relu` runs everywhere, and only GPU
  runs (or interpreter tests) take the kernel.

Backward (both paths): grad_y is multiplied by the ReLU mask once (y > 0, from the saved
output; relu(z) > 0 exactly where z > 0), then one `aten.convolution_backward` call gives
grad-input, grad-weight and grad-bias (its sum over N, H, W), each only when needed.

Registration, both around the same forward (`_forward`) and backward (`_backward`) code:
- eager: `ConvReLUFunction`, a torch.autograd.Function (the issue's form, report B's too);
- under torch.compile: `torch.ops.ddplab.conv_relu`, a torch.library.custom_op with
  register_fake and register_autograd (STYLE rule 14), so the compiler sees one opaque op
  with shapes instead of tracing into Triton's launch code. `torch.ops.ddplab.conv_relu`
  is also differentiable when called directly (tested with opcheck and gradcheck).
Why two: calling a custom_op in eager mode costs several times an autograd.Function's
Python overhead (measured here on a tiny conv: ~400 us vs ~100 us per call on a loaded
2-core CPU), and the seed's 2-layer net runs in tens of microseconds on a GPU, so eager
calls take the cheaper door. Both doors work from torch 2.4 (custom_op's first release)
through 2.13.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.modules.utils import _pair

from ddplab.kernels import _runtime
from ddplab.kernels.reference import conv_out_size, conv_relu_backward_reference, conv_relu_reference

BACKENDS = ("auto", "triton", "reference")
TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def triton_unavailable_reason(device: torch.device | str, dtype: torch.dtype = torch.float32) -> str | None:
    """None when the fused Triton kernel can run on `device` / `dtype`, else why not."""
    if dtype not in TRITON_DTYPES:
        return f"the Triton kernel takes fp32/fp16/bf16, not {dtype} (float64 uses the reference)"
    return _runtime.triton_unavailable_reason(device)


def resolve_backend(backend: str, x: torch.Tensor) -> str:
    """The path that runs for `backend` on `x`: "triton" or "reference" (see module docstring)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown conv_relu backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if backend == "reference":
        return "reference"
    reason = triton_unavailable_reason(x.device, x.dtype)
    if reason is None:
        return "triton"
    if backend == "triton":
        raise RuntimeError(f"conv_relu backend='triton' is unavailable: {reason}")
    return "reference"


def _check_args(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if x.dim() != 4 or weight.dim() != 4:
        raise ValueError(f"expected 4-D input and weight, got {tuple(x.shape)} and {tuple(weight.shape)}")
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"input has {x.shape[1]} channels but the weight expects {weight.shape[1]} (groups=1 only)")
    tensors = [x, weight] + ([bias] if bias is not None else [])
    if len({t.dtype for t in tensors}) != 1 or len({t.device for t in tensors}) != 1:
        raise ValueError("input, weight and bias must share one dtype and one device")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")


def fused_conv_relu(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    backend: str = "auto",
) -> torch.Tensor:
    """relu(conv2d(x, weight, bias, stride, padding, dilation)), differentiable, groups=1.

    x is N x C x H x W (or unbatched C x H x W, as nn.Conv2d accepts); weight K x C x R x S.
    """
    unbatched = x.dim() == 3
    if unbatched:
        x = x.unsqueeze(0)
    if x.device.type in ("cpu", "cuda") and torch.is_autocast_enabled(x.device.type):
        # Behave like conv2d under autocast: compute in the autocast dtype, whatever the
        # parameters' dtype, and run the op itself with autocast off (one dtype inside).
        dtype = torch.get_autocast_dtype(x.device.type)
        x, weight = x.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
        with torch.autocast(x.device.type, enabled=False):
            y = fused_conv_relu(x, weight, bias, stride, padding, dilation, backend)
        return y.squeeze(0) if unbatched else y
    _check_args(x, weight, bias)
    args = [list(_pair(v)) for v in (stride, padding, dilation)]
    if min(args[0]) < 1 or min(args[1]) < 0 or min(args[2]) < 1:
        raise ValueError(f"need stride >= 1, padding >= 0, dilation >= 1, got {args}")
    backend = resolve_backend(backend, x)  # fail fast, before any autograd bookkeeping
    if torch.compiler.is_compiling():
        y = torch.ops.ddplab.conv_relu(x, weight, bias, *args, backend)
    else:
        y = ConvReLUFunction.apply(x, weight, bias, *args, backend)
    return y.squeeze(0) if unbatched else y


def _output_shape(x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation) -> tuple[int, ...]:
    n, _, h, w = x.shape
    k, _, r, s = weight.shape
    return (
        n,
        k,
        conv_out_size(h, r, stride[0], padding[0], dilation[0]),
        conv_out_size(w, s, stride[1], padding[1], dilation[1]),
    )


def _forward(x, weight, bias, stride, padding, dilation, backend: str) -> torch.Tensor:
    if resolve_backend(backend, x) == "triton":
        from ddplab.kernels import _triton

        return _triton.conv_relu_forward(x, weight, bias, tuple(stride), tuple(padding), tuple(dilation))
    return conv_relu_reference(x, weight, bias, stride, padding, dilation)


def _save_for_backward(ctx, x, weight, bias, y, stride, padding, dilation) -> None:
    ctx.save_for_backward(x, weight, y)
    ctx.has_bias = bias is not None
    ctx.conv_args = (stride, padding, dilation)


def _backward(ctx, grad_y: torch.Tensor):
    x, weight, y = ctx.saved_tensors
    needs = tuple(ctx.needs_input_grad[:3])
    stride, padding, dilation = ctx.conv_args
    grad_x, grad_w, grad_b = conv_relu_backward_reference(
        grad_y, x, weight, y, ctx.has_bias, stride, padding, dilation, needs_grad=needs
    )
    return grad_x, grad_w, grad_b, None, None, None, None


class ConvReLUFunction(torch.autograd.Function):
    """relu(conv2d(x, weight, bias)) forward, ReLU-masked conv gradients backward (eager path)."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, backend):
        y = _forward(x, weight, bias, stride, padding, dilation, backend)
        _save_for_backward(ctx, x, weight, bias, y, stride, padding, dilation)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        return _backward(ctx, grad_y)


# The schema is written out: torch 2.4-2.6 cannot infer it from these annotations (string
# annotations from `from __future__ import annotations`, and list[int]); see compat.py.
@torch.library.custom_op(
    "ddplab::conv_relu",
    mutates_args=(),
    schema=(
        "(Tensor x, Tensor weight, Tensor? bias, int[] stride, int[] padding, int[] dilation, str backend) -> Tensor"
    ),
)
def _conv_relu_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    backend: str,
) -> torch.Tensor:
    return _forward(x, weight, bias, stride, padding, dilation, backend)


@_conv_relu_op.register_fake
def _(x, weight, bias, stride, padding, dilation, backend):
    shape = _output_shape(x, weight, stride, padding, dilation)
    channels_last = x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=fmt)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, stride, padding, dilation, _ = inputs
    _save_for_backward(ctx, x, weight, bias, output, stride, padding, dilation)


_conv_relu_op.register_autograd(_backward, setup_context=_setup_context)


class FusedConvReLU(nn.Module):
    """Drop-in for `nn.Sequential(nn.Conv2d(...), nn.ReLU())`, groups=1, zero padding.

    Parameters are named and initialized exactly as nn.Conv2d's (same RNG draws), so
    state dicts are interchangeable. `backend` picks the path (see module docstring).
    """

    bias: torch.Tensor | None

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        bias: bool = True,
        device=None,
        dtype=None,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"unknown conv_relu backend {backend!r}: choose one of {', '.join(BACKENDS)}")
        # torch's stubs take tuples only: any sequence works the same at run time.
        shape: dict[str, Any] = dict(kernel_size=kernel_size, stride=stride, padding=padding, dilation=dilation)
        conv = nn.Conv2d(in_channels, out_channels, **shape, bias=bias, device=device, dtype=dtype)
        self._take(conv)
        self.backend = backend

    def _take(self, conv: nn.Conv2d) -> None:
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size = tuple(conv.kernel_size)
        assert not isinstance(conv.padding, str)  # from_conv refuses one; __init__ takes ints
        self.stride, self.padding, self.dilation = tuple(conv.stride), tuple(conv.padding), tuple(conv.dilation)
        self.weight = conv.weight
        self.register_parameter("bias", conv.bias)  # type: ignore[arg-type]  # a Parameter, or None, as in nn.Conv2d

    @staticmethod
    def unsupported_reason(conv: nn.Conv2d) -> str | None:
        """None when `conv` can be fused, else why not."""
        if conv.groups != 1:
            return f"groups={conv.groups} (only 1 is fused)"
        if conv.padding_mode != "zeros":
            return f"padding_mode={conv.padding_mode!r} (only 'zeros' is fused)"
        if isinstance(conv.padding, str):
            return f"padding={conv.padding!r} (give explicit padding)"
        return None

    @classmethod
    def from_conv(cls, conv: nn.Conv2d, backend: str = "auto") -> FusedConvReLU:
        """A FusedConvReLU computing relu(conv(x)) that takes over `conv`'s Parameters.

        The Parameter objects are shared, not copied: no extra memory, an optimizer that
        already holds them keeps working, and the outputs are the same numbers.
        """
        reason = cls.unsupported_reason(conv)
        if reason is not None:
            raise ValueError(f"cannot fuse {conv}: {reason}")
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module._take(conv)
        if backend not in BACKENDS:
            raise ValueError(f"unknown conv_relu backend {backend!r}: choose one of {', '.join(BACKENDS)}")
        module.backend = backend
        module.train(conv.training)
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_conv_relu(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.backend)

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, dilation={self.dilation}, bias={self.bias is not None}, "
            f"backend={self.backend!r}"
        )
