"""fuse_conv_relu on hand-built Sequentials and on every registry model."""

import copy

import pytest
import torch
from torch import nn

from ddplab.kernels import FusedConvReLU, fuse_conv_relu
from ddplab.kernels.conv_relu import triton_unavailable_reason
from ddplab.models import create_model, list_models

# Conv2d -> [Identity] -> ReLU pairs per model with batchnorm off (resnet18's blocks apply
# F.relu in forward(), so only its stem is a Sequential pair; fastnet and speednet use GELU).
EXPECTED_PAIRS = {"simple_cnn": 3, "vgg_small": 6, "resnet18": 1, "fastnet": 0, "speednet": 0}


SIDE = 9  # the smallest images every registry model takes (speednet's stem and poolings need 9x9)


def small_model(name: str, batchnorm: bool = False) -> nn.Module:
    torch.manual_seed(0)
    return create_model(name, num_classes=3, image_size=SIDE, width=0.125, dropout=0.0, batchnorm=batchnorm)


def outputs_and_grads(model: nn.Module, x: torch.Tensor):
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    y = model(x)
    y.square().sum().backward()
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def test_every_registry_model_is_covered():
    assert set(EXPECTED_PAIRS) == set(list_models())


@pytest.mark.parametrize("name", sorted(EXPECTED_PAIRS))
def test_fused_registry_model_gives_identical_outputs_and_gradients(name):
    model = small_model(name).train()
    fused = copy.deepcopy(model)
    assert fuse_conv_relu(fused, backend="reference") == EXPECTED_PAIRS[name]
    assert sum(isinstance(m, FusedConvReLU) for m in fused.modules()) == EXPECTED_PAIRS[name]
    assert list(fused.state_dict()) == list(model.state_dict())  # checkpoints stay interchangeable
    x = torch.randn(2, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(1))
    y, gx, grads = outputs_and_grads(model, x)
    y_f, gx_f, grads_f = outputs_and_grads(fused, x)
    assert torch.equal(y, y_f) and torch.equal(gx, gx_f)
    assert grads.keys() == grads_f.keys() and all(torch.equal(grads[k], grads_f[k]) for k in grads)


@pytest.mark.parametrize("name", ["simple_cnn", "vgg_small", "resnet18"])
def test_batchnorm_between_conv_and_relu_blocks_fusion(name):
    assert fuse_conv_relu(small_model(name, batchnorm=True)) == 0


@pytest.mark.skipif(
    triton_unavailable_reason("cuda" if torch.cuda.is_available() else "cpu") is not None,
    reason="Triton kernel unavailable here",
)
def test_fused_model_on_the_triton_kernel_matches(device, full_fp32):
    model = small_model("simple_cnn").to(device)
    fused = copy.deepcopy(model)
    assert fuse_conv_relu(fused, backend="triton") == 3
    x = torch.randn(2, 3, SIDE, SIDE, generator=torch.Generator().manual_seed(2)).to(device)
    y, gx, grads = outputs_and_grads(model, x)
    y_f, gx_f, grads_f = outputs_and_grads(fused, x)
    torch.testing.assert_close(y_f, y, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gx_f, gx, rtol=1e-4, atol=1e-4)
    for k in grads:
        torch.testing.assert_close(grads_f[k], grads[k], rtol=1e-4, atol=1e-4)


def test_only_adjacent_pairs_inside_sequentials_are_fused():
    conv = nn.Conv2d(3, 4, 3, padding=1)
    net = nn.Sequential(
        conv,
        nn.Identity(),
        nn.ReLU(inplace=True),  # fused (Identity skipped)
        nn.Conv2d(4, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),  # BN in between: kept
        nn.Conv2d(4, 4, 3, padding=1, groups=2),
        nn.ReLU(),  # groups=2: kept
        nn.Conv2d(4, 4, 1),
        nn.GELU(),  # not a ReLU: kept
        nn.Sequential(nn.Conv2d(4, 4, 1), nn.ReLU()),  # nested: fused
        nn.Conv2d(4, 4, 1),  # last, no ReLU: kept
    )
    reference = copy.deepcopy(net).eval()
    assert fuse_conv_relu(net, backend="reference") == 2
    assert isinstance(net[0], FusedConvReLU) and net[0].weight is conv.weight
    assert isinstance(net[1], nn.Identity) and isinstance(net[2], nn.Identity)
    assert isinstance(net[3], nn.Conv2d) and isinstance(net[6], nn.Conv2d) and isinstance(net[8], nn.Conv2d)
    assert isinstance(net[10][0], FusedConvReLU) and isinstance(net[10][1], nn.Identity)
    x = torch.randn(2, 3, 6, 6)
    assert torch.equal(net.eval()(x), reference(x))
    assert fuse_conv_relu(net) == 0  # idempotent


def test_a_shared_layer_looped_in_a_sequential_stays_shared():
    shared = nn.Conv2d(4, 4, 3, padding=1)
    net = nn.Sequential(*[m for _ in range(3) for m in (shared, nn.ReLU())])
    reference = copy.deepcopy(net)
    assert fuse_conv_relu(net, backend="reference") == 3
    assert {id(m.weight) for m in net if isinstance(m, FusedConvReLU)} == {id(shared.weight)}
    assert len(list(net.parameters())) == 2
    x = torch.randn(1, 4, 5, 5)
    assert torch.equal(net(x), reference(x))
