"""Pure-PyTorch ground truth for the custom kernels: every fast path is tested against these.

RGB -> grayscale uses the seed's (report A) luma coefficients, Gray = 0.2989 R + 0.5870 G
+ 0.1140 B. They are written here as integers per 10000 (`GRAY_WEIGHTS_E4`) because that
makes uint8 rounding exact and identical across implementations: 2989 R + 5870 G + 1140 B is
an integer, so Gray is a multiple of 1e-4, a tie (fraction exactly .5) is representable in
binary, and "round half up" (floor(g + 0.5)) has one answer. Every uint8 path computes the
same thing in integer arithmetic, (2989 R + 5870 G + 1140 B + 5000) // 10000; the float64
reference below computes it in float64 with the seed's coefficients, and the two agree
bit for bit (tested). The weights sum to 0.9999, so the result never exceeds 255; the clamp
only documents the contract.

Conv+ReLU is `relu(conv2d(x, w, b))`; its backward applies the ReLU mask once (grad where
y > 0, which is where the pre-activation is > 0) and then PyTorch's convolution gradient
(`aten.convolution_backward`), as report B's autograd.Function did.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

GRAY_WEIGHTS_E4 = (2989, 5870, 1140)  # R, G, B luma weights times 10000 (seed report A)
GRAY_WEIGHTS = tuple(w / 10000 for w in GRAY_WEIGHTS_E4)  # (0.2989, 0.5870, 0.1140)
GRAY_SCALE = 10000


def check_rgb(x: torch.Tensor) -> None:
    """Raise ValueError unless `x` is C x H x W or N x C x H x W with C == 3, uint8 or float."""
    if x.dim() not in (3, 4) or x.shape[-3] != 3:
        raise ValueError(f"rgb_to_gray expects 3 x H x W or N x 3 x H x W, got shape {tuple(x.shape)}")
    if x.dtype != torch.uint8 and not x.dtype.is_floating_point:
        raise ValueError(f"rgb_to_gray expects uint8 or floating-point input, got {x.dtype}")


def gray_shape(x: torch.Tensor) -> tuple[int, ...]:
    """Output shape: the channel dimension dropped (H x W, or N x H x W)."""
    return (*x.shape[:-3], *x.shape[-2:])


def rgb_to_gray_reference(x: torch.Tensor) -> torch.Tensor:
    """Gray in float64, then cast back to x's dtype; uint8 output is rounded half up and clamped.

    Float inputs keep their range (no clamping): [0, 1] in gives [0, 1) out, [0, 255] gives
    [0, 255). The output has x's dtype and device.
    """
    check_rgb(x)
    x64 = x.to(torch.float64)
    r, g, b = x64.unbind(-3)
    if x.dtype == torch.uint8:
        # The integer numerator is exact in float64 and the division is correctly rounded,
        # so a tie k + 0.5 comes out exactly and floor(g + 0.5) rounds it up, like the
        # integer paths do.
        e_r, e_g, e_b = GRAY_WEIGHTS_E4
        gray = (e_r * r + e_g * g + e_b * b) / GRAY_SCALE
        return torch.floor(gray + 0.5).clamp_(0, 255).to(torch.uint8)
    w_r, w_g, w_b = GRAY_WEIGHTS
    return (w_r * r + w_g * g + w_b * b).to(x.dtype)


def conv_relu_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: Sequence[int] = (1, 1),
    padding: Sequence[int] = (0, 0),
    dilation: Sequence[int] = (1, 1),
) -> torch.Tensor:
    """relu(conv2d(x, weight, bias)) with groups=1: exactly what nn.Conv2d + nn.ReLU compute."""
    return F.relu(F.conv2d(x, weight, bias, tuple(stride), tuple(padding), tuple(dilation)))


def conv_relu_backward_reference(
    grad_y: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    y: torch.Tensor,
    has_bias: bool,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    needs_grad: tuple[bool, bool, bool] = (True, True, True),
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(grad_x, grad_weight, grad_bias) of y = relu(conv2d(x, weight, bias)), given the saved y.

    The ReLU mask is applied once, to grad_y; the three gradients then come from one call to
    `aten.convolution_backward` (grad_bias is its sum over N, H, W). Entries of `needs_grad`
    that are False are returned as None and not computed.
    """
    masked = torch.where(y > 0, grad_y, torch.zeros((), dtype=grad_y.dtype, device=grad_y.device))
    want_x, want_w, want_b = needs_grad
    want_b = want_b and has_bias
    grad_x, grad_w, grad_b = torch.ops.aten.convolution_backward(
        masked,
        x,
        weight,
        [weight.shape[0]] if has_bias else None,
        list(stride),
        list(padding),
        list(dilation),
        False,  # transposed
        [0, 0],  # output_padding
        1,  # groups
        [want_x, want_w, want_b],
    )
    return (grad_x if want_x else None, grad_w if want_w else None, grad_b if want_b else None)


def conv_out_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    """Output length of a convolution along one dimension (PyTorch's formula)."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
