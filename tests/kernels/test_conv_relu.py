"""FusedConvReLU: gradcheck of the autograd formula, and the Triton kernel against nn.Conv2d + ReLU.

On a CPU machine the Triton kernel runs in Triton's interpreter (TRITON_INTERPRET=1, set by
conftest.py), which is slow: shapes stay tiny (N <= 2, C <= 20, H, W <= 13).
"""

import random

import pytest
import torch
from torch import nn

from ddplab.kernels import FusedConvReLU, fused_conv_relu
from ddplab.kernels.conv_relu import resolve_backend, triton_unavailable_reason
from ddplab.kernels.reference import conv_relu_reference

CPU_REASON = triton_unavailable_reason("cuda" if torch.cuda.is_available() else "cpu")
needs_triton = pytest.mark.skipif(CPU_REASON is not None, reason=f"Triton kernel: {CPU_REASON}")


# n, c, k(out), h, w, kernel, stride, padding, dilation, bias: odd sizes, channels that are not
# multiples of 16 (tile edges), C=1 first layers, K=1, a long reduction (C*R*S = 500).
CASES = [
    (2, 3, 5, 13, 11, 3, 1, 1, 1, True),
    (1, 17, 19, 9, 9, 3, 2, 2, 1, True),
    (2, 5, 7, 7, 8, 1, 1, 0, 1, False),
    (1, 4, 6, 12, 12, 3, 1, 2, 2, True),
    (2, 20, 13, 11, 13, 5, 2, 2, 1, True),
    (1, 1, 13, 13, 10, 3, 2, 0, 1, True),
    (2, 7, 1, 6, 13, 3, 1, 1, 2, False),
]
KEYS = ("n", "c", "k", "h", "w", "kernel", "stride", "padding", "dilation", "bias")


def random_case(seed: int) -> dict:
    """A conv of random small size: channels not multiples of 16, padding 0-2, stride 1-2."""
    rng = random.Random(seed)
    kernel = rng.choice([1, 3, 3, 5])
    return dict(
        n=rng.choice([1, 2]),
        c=rng.choice([1, 3, 5, 7, 17, 20]),
        k=rng.choice([1, 6, 13, 19]),
        h=rng.randint(kernel + 2, 13),
        w=rng.randint(kernel + 2, 13),
        kernel=kernel,
        stride=rng.choice([1, 2]),
        padding=rng.choice([0, 1, 2]),
        dilation=rng.choice([1, 1, 2]),
        bias=rng.random() < 0.75,
    )


def make_conv(case: dict, dtype=torch.float32, device="cpu") -> nn.Conv2d:
    torch.manual_seed(case["c"] * 100 + case["k"])
    return nn.Conv2d(
        case["c"], case["k"], case["kernel"], case["stride"], case["padding"], case["dilation"], bias=case["bias"]
    ).to(device=device, dtype=dtype)


def compare_with_conv2d(case: dict, dtype, device, tol: float) -> None:
    conv = make_conv(case, dtype, device)
    fused = FusedConvReLU.from_conv(make_conv(case, dtype, device), backend="triton")
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(case["n"], case["c"], case["h"], case["w"], generator=gen).to(device=device, dtype=dtype)
    x_ref, x_fused = x.clone().requires_grad_(), x.clone().requires_grad_()
    # The reference runs in fp32 from the same low-precision inputs (what fp32 accumulation gives).
    ref = torch.relu(
        nn.functional.conv2d(
            x_ref.float(),
            conv.weight.float(),
            None if conv.bias is None else conv.bias.float(),
            conv.stride,
            conv.padding,
            conv.dilation,
        )
    )
    y = fused(x_fused)
    assert y.dtype == dtype and y.shape == ref.shape
    torch.testing.assert_close(y.float(), ref, rtol=tol, atol=tol)
    grad = torch.randn(ref.shape, generator=gen).to(device)
    ref.backward(grad)
    y.backward(grad.to(dtype))
    torch.testing.assert_close(x_fused.grad.float(), x_ref.grad.float(), rtol=tol, atol=tol * 10)
    torch.testing.assert_close(fused.weight.grad.float(), conv.weight.grad.float(), rtol=tol, atol=tol * 10)
    if case["bias"]:
        torch.testing.assert_close(fused.bias.grad.float(), conv.bias.grad.float(), rtol=tol, atol=tol * 10)


@needs_triton
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:5])) + f"-k{c[5]}s{c[6]}p{c[7]}d{c[8]}")
def test_triton_fp32_matches_conv2d_relu(case, device, full_fp32):
    compare_with_conv2d(dict(zip(KEYS, case, strict=True)), torch.float32, device, tol=1e-4)


@needs_triton
@pytest.mark.parametrize("seed", range(3))
def test_triton_fp32_matches_conv2d_relu_on_random_shapes(seed, device, full_fp32):
    compare_with_conv2d(random_case(seed), torch.float32, device, tol=1e-4)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", [CASES[0], CASES[4]], ids=["small", "long-reduction"])
def test_triton_half_precision_accumulates_in_fp32(dtype, case, device):
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    compare_with_conv2d(dict(zip(KEYS, case, strict=True)), dtype, device, tol=tol)


@needs_triton
def test_triton_kernel_writes_every_output_element(device, full_fp32):
    from ddplab.kernels import _triton

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 11, 9, generator=gen).to(device)
    w = torch.randn(19, 5, 3, 3, generator=gen).to(device)
    b = torch.randn(19, generator=gen).to(device)
    out = torch.full((2, 19, 6, 5), float("nan"), device=device)
    _triton.conv_relu_forward(x, w, b, (2, 2), (1, 1), (1, 1), out=out)
    assert not out.isnan().any()
    torch.testing.assert_close(out, conv_relu_reference(x, w, b, (2, 2), (1, 1), (1, 1)), rtol=1e-4, atol=1e-4)


@needs_triton
def test_triton_channels_last_input_gives_channels_last_output(device, full_fp32):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 6, 7, 10, generator=gen).to(device).to(memory_format=torch.channels_last)
    w = torch.randn(13, 6, 3, 3, generator=gen).to(device)
    y = fused_conv_relu(x, w, None, 1, 1, backend="triton")
    assert y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y, conv_relu_reference(x, w, None, (1, 1), (1, 1), (1, 1)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("stride,padding,dilation", [(1, 0, 1), (2, 1, 1), (1, 2, 2)])
def test_gradcheck_float64(bias, stride, padding, dilation):
    gen = torch.Generator().manual_seed(stride * 10 + padding)
    x = torch.randn(2, 3, 7, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, generator=gen, requires_grad=True) if bias else None
    assert resolve_backend("auto", x) == "reference"  # float64 always takes the reference path
    inputs = (x, w, b) if bias else (x, w)

    def fn(*args):
        return fused_conv_relu(args[0], args[1], args[2] if bias else None, stride, padding, dilation)

    assert torch.autograd.gradcheck(fn, inputs, fast_mode=True)


def test_opcheck_schema_fake_and_autograd_registration():
    x = torch.randn(2, 3, 6, 5, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, requires_grad=True)
    b = torch.randn(4, requires_grad=True)
    torch.library.opcheck(torch.ops.ddplab.conv_relu.default, (x, w, b, [1, 1], [1, 1], [1, 1], "reference"))
    with torch.device("meta"):
        y = fused_conv_relu(torch.empty(8, 3, 13, 12), torch.empty(5, 3, 3, 3), None, stride=2, padding=1)
    assert y.shape == (8, 5, 7, 6)


def test_module_is_a_drop_in_for_conv2d_relu():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 6, 3, stride=2, padding=1)
    torch.manual_seed(0)
    fused = FusedConvReLU(3, 6, 3, stride=2, padding=1, backend="reference")
    assert list(fused.state_dict()) == ["weight", "bias"]
    assert torch.equal(fused.weight, conv.weight) and torch.equal(fused.bias, conv.bias)  # same init draws
    x = torch.randn(3, 9, 9)  # unbatched, as nn.Conv2d accepts
    assert torch.equal(fused(x), torch.relu(conv(x)))
    no_bias = FusedConvReLU(3, 6, 1, bias=False)
    assert no_bias.bias is None and list(no_bias.state_dict()) == ["weight"]


def test_from_conv_shares_parameters_and_rejects_what_it_cannot_fuse():
    conv = nn.Conv2d(4, 8, 3, padding=1)
    fused = FusedConvReLU.from_conv(conv)
    assert fused.weight is conv.weight and fused.bias is conv.bias
    assert "backend='auto'" in repr(fused)
    with pytest.raises(ValueError, match="groups=2"):
        FusedConvReLU.from_conv(nn.Conv2d(4, 8, 3, groups=2))
    with pytest.raises(ValueError, match="padding_mode"):
        FusedConvReLU.from_conv(nn.Conv2d(4, 8, 3, padding=1, padding_mode="reflect"))
    with pytest.raises(ValueError, match="padding='same'"):
        FusedConvReLU.from_conv(nn.Conv2d(4, 8, 3, padding="same"))


def test_backend_rules():
    x64 = torch.zeros(1, 2, 5, 5, dtype=torch.float64)
    w64 = torch.zeros(3, 2, 3, 3, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="backend='triton' is unavailable"):
        fused_conv_relu(x64, w64, backend="triton")
    with pytest.raises(ValueError, match="unknown conv_relu backend"):
        fused_conv_relu(x64, w64, backend="cudnn")
    with pytest.raises(ValueError, match="channels"):
        fused_conv_relu(torch.zeros(1, 3, 5, 5), torch.zeros(3, 2, 3, 3))
    expected = "triton" if CPU_REASON is None else "reference"
    assert resolve_backend("auto", torch.zeros(1, device="cuda" if torch.cuda.is_available() else "cpu")) == expected


def test_the_registered_op_is_differentiable_on_its_own():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, 2, 5, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(3, 2, 3, 3, dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, generator=gen, requires_grad=True)

    def op(x, w, b):
        return torch.ops.ddplab.conv_relu(x, w, b, [2, 1], [1, 2], [1, 1], "auto")

    assert torch.autograd.gradcheck(op, (x, w, b), fast_mode=True)


def test_torch_compile_traces_the_custom_op_in_one_graph():
    """Under torch.compile the op (not the autograd.Function) is traced, through its fake impl."""
    targets = []

    def recording_backend(gm, example_inputs):
        targets.extend(str(node.target) for node in gm.graph.nodes)
        return gm.forward

    module = FusedConvReLU(3, 4, 3, padding=1, backend="reference")
    compiled = torch.compile(module, backend=recording_backend, fullgraph=True)
    x = torch.randn(2, 3, 6, 7, requires_grad=True)
    y = compiled(x)
    y.sum().backward()
    assert any("ddplab.conv_relu" in t for t in targets), targets
    assert torch.equal(y, module(x))
    assert module.weight.grad is not None and x.grad.shape == x.shape


@needs_triton
def test_triton_accepts_strided_weight_and_bias(device, full_fp32):
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(1, 4, 9, 8, generator=gen).to(device)
    w_big = torch.randn(6, 4, 3, 3, generator=gen).to(device)
    b_big = torch.randn(12, generator=gen).to(device)
    w, b = w_big.permute(0, 1, 3, 2), b_big[::2]  # non-contiguous views
    y = fused_conv_relu(x, w, b, 1, 1, backend="triton")
    torch.testing.assert_close(y, conv_relu_reference(x, w, b, (1, 1), (1, 1), (1, 1)), rtol=1e-4, atol=1e-4)
