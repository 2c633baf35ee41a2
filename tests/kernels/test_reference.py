"""The references themselves: exact uint8 rounding, and conv+ReLU equal to nn.Conv2d + nn.ReLU."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ddplab.kernels.reference import (
    GRAY_WEIGHTS,
    conv_relu_backward_reference,
    conv_relu_reference,
    rgb_to_gray_reference,
)


def all_rgb_triples() -> torch.Tensor:
    v = torch.arange(256, dtype=torch.uint8)
    r, g, b = torch.meshgrid(v, v, v, indexing="ij")
    return torch.stack([r, g, b]).reshape(3, 4096, 4096)


@pytest.mark.slow(why="all 16.7 M RGB triples: 4-8 s of CPU on a loaded 2-core machine, near the in-process budget")
def test_uint8_reference_is_exact_round_half_up_on_every_rgb_triple():
    x = all_rgb_triples()
    xi = x.to(torch.int32)
    exact = (2989 * xi[0] + 5870 * xi[1] + 1140 * xi[2] + 5000) // 10000
    assert torch.equal(rgb_to_gray_reference(x), exact.to(torch.uint8))


def test_uint8_reference_covers_black_white_and_ties():
    x = torch.tensor([[0, 255, 1], [0, 255, 0], [0, 255, 0]], dtype=torch.uint8).view(3, 1, 3)
    # 0.2989 * 1 rounds to 0; white stays 255 (weights sum to 0.9999).
    assert rgb_to_gray_reference(x).tolist() == [[0, 255, 0]]
    # Exact ties round up: 0.114 * 250 = 28.5 -> 29, 0.587 * 36 + 0.114 * 12 = 22.5 -> 23 (the
    # literal float64 sum of the second is 22.499999999999996, which naive rounding sends to 22).
    ties = torch.tensor([[0, 0], [0, 36], [250, 12]], dtype=torch.uint8).view(3, 1, 2)
    assert rgb_to_gray_reference(ties).tolist() == [[29, 23]]
    assert 0.2989 * 0 + 0.5870 * 36 + 0.1140 * 12 < 22.5


def test_float_reference_uses_the_seed_coefficients():
    x = torch.rand(2, 3, 4, 5, dtype=torch.float64)
    expected = GRAY_WEIGHTS[0] * x[:, 0] + GRAY_WEIGHTS[1] * x[:, 1] + GRAY_WEIGHTS[2] * x[:, 2]
    assert GRAY_WEIGHTS == (0.2989, 0.587, 0.114)
    torch.testing.assert_close(rgb_to_gray_reference(x), expected, rtol=1e-15, atol=1e-15)
    assert rgb_to_gray_reference(x[0]).shape == (4, 5)
    assert rgb_to_gray_reference(x.float()).dtype == torch.float32


def test_conv_relu_reference_is_conv2d_plus_relu_bit_for_bit():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 5, 3, stride=2, padding=1, dilation=2)
    x = torch.randn(2, 3, 11, 9)
    expected = torch.relu(conv(x))
    got = conv_relu_reference(x, conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation)
    assert torch.equal(got, expected)


def test_backward_reference_matches_autograd_and_skips_unneeded_grads():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)
    y = F.relu(F.conv2d(x, w, b, 1, 2, 1))
    g = torch.randn_like(y)
    expected = torch.autograd.grad(y, (x, w, b), g)
    got = conv_relu_backward_reference(g, x, w, y.detach(), True, (1, 1), (2, 2), (1, 1))
    for a, e in zip(got, expected, strict=True):
        torch.testing.assert_close(a, e)
    only_w = conv_relu_backward_reference(g, x, w, y.detach(), True, (1, 1), (2, 2), (1, 1), (False, True, False))
    assert only_w[0] is None and only_w[2] is None
    torch.testing.assert_close(only_w[1], expected[1])
    no_bias = conv_relu_backward_reference(g, x, w, y.detach(), False, (1, 1), (2, 2), (1, 1))
    assert no_bias[2] is None
