"""ddplab.models: every registered model is tested through the registry (timm-style), so a
newly registered model is covered without touching this file."""

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ddplab.errors import ConfigError
from ddplab.models import (
    count_flops,
    count_params,
    create_model,
    default_options,
    describe_models,
    list_models,
    model_info,
    register_model,
)

MODELS = list_models()
# The option and shape tests run on small inputs and (except where width is the point) a
# quarter-width net: the logic under test does not depend on either, and the file must stay
# fast on a 2-core CPU. Full-width nets are exercised by test_default_model_training_step and
# the exact parameter and FLOP counts.
SMALL = (3, 16, 16)
NARROW = 0.25


@pytest.fixture(autouse=True, scope="module")
def _one_intra_op_thread():
    # These tensors are tiny: intra-op threads only add synchronization, and on a busy 2-core
    # machine OpenMP threads waiting on each other made this file over 10x slower.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _forward_backward(model: nn.Module, shape: tuple[int, int, int], num_classes: int) -> None:
    """One training step's forward and backward on a batch of 2; checks shape and gradients."""
    x = torch.randn(2, *shape)
    y = torch.randint(0, num_classes, (2,))
    out = model(x)
    assert out.shape == (2, num_classes)
    F.cross_entropy(out, y).backward()
    for pname, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None, f"{pname} got no gradient"
            assert torch.isfinite(p.grad).all(), f"{pname} has a non-finite gradient"


def _build(name: str, shape=SMALL, num_classes: int = 10, **options) -> nn.Module:
    options.setdefault("width", NARROW)
    return create_model(name, num_classes=num_classes, in_channels=shape[0], image_size=shape[1:], **options)


def _has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def _dropout_rates(model: nn.Module) -> set[float]:
    return {m.p for m in model.modules() if isinstance(m, nn.Dropout)}


def test_the_four_families_are_registered():
    assert {"simple_cnn", "vgg_small", "resnet18", "fastnet"} <= set(MODELS)
    assert MODELS == sorted(MODELS)


@pytest.mark.parametrize("name", MODELS)
def test_default_model_training_step(name):
    # Full width, default options, CIFAR-sized input.
    torch.manual_seed(0)
    model = create_model(name, num_classes=10)
    model.train()
    _forward_backward(model, (3, 32, 32), 10)


# Odd, tiny, standard and large images, one or three channels, 2 to 100 classes.
@pytest.mark.parametrize(
    "shape,num_classes",
    [((3, 17, 23), 2), ((1, 7, 7), 100), ((3, 32, 32), 10), ((3, 96, 96), 10)],
    ids=["17x23", "7x7-gray", "32x32", "96x96"],
)
@pytest.mark.parametrize("name", MODELS)
def test_forward_backward_on_any_image_size(name, shape, num_classes):
    torch.manual_seed(0)
    if name == "speednet" and min(shape[1:]) < 9:  # a 2x2 stem and three poolings that round down
        with pytest.raises(ConfigError, match="at least 9x9 pixels"):
            _build(name, shape, num_classes)
        return
    _forward_backward(_build(name, shape, num_classes), shape, num_classes)


@pytest.mark.parametrize("name", MODELS)
def test_a_1x1_image_still_works(name):
    # Pooling (ceil_mode) and stride-2 convs never shrink a side to 0.
    torch.manual_seed(0)
    if name == "speednet":  # a 2x2 stem, then poolings that round down (fewer FLOPs): 9x9 works, 8x8 is refused
        with pytest.raises(ConfigError, match="at least 9x9 pixels"):
            _build(name, (3, 8, 8))
        _forward_backward(_build(name, (3, 9, 9)), (3, 9, 9), 10)
        return
    model = _build(name, (3, 1, 1))
    _forward_backward(model, (3, 1, 1), 10)


@pytest.mark.parametrize("batchnorm", [True, False])
@pytest.mark.parametrize("name", MODELS)
def test_batchnorm_on_and_off(name, batchnorm):
    torch.manual_seed(0)
    model = _build(name, batchnorm=batchnorm)
    assert _has_batchnorm(model) == batchnorm
    # A conv bias right before BatchNorm is redundant: convs carry a bias exactly when BN is off
    # (speednet's whitening stem is followed by no norm, and its bias is the one part of it that trains).
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d) and m is not getattr(model, "whitening", None)]
    assert all((conv.bias is None) == batchnorm for conv in convs)
    _forward_backward(model, SMALL, 10)


@pytest.mark.parametrize("width", [0.5, 2.0])
@pytest.mark.parametrize("name", MODELS)
def test_width_multiplier(name, width):
    torch.manual_seed(0)
    model = _build(name, (3, 9, 9), width=width)
    _forward_backward(model, (3, 9, 9), 10)
    default_params = model_info(name, num_classes=10, image_size=9)["params"]
    assert (count_params(model) > default_params) == (width > 1)


def test_width_rounds_and_never_reaches_zero():
    model = create_model("simple_cnn", num_classes=10, width=0.01)  # 32*0.01 -> 1 channel
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in convs] == [1, 1, 1]
    model = create_model("simple_cnn", num_classes=10, width=0.5)
    assert [c.out_channels for c in model.modules() if isinstance(c, nn.Conv2d)] == [16, 32, 64]


@pytest.mark.parametrize("name", MODELS)
def test_dropout_is_active_in_train_mode_only(name):
    torch.manual_seed(0)
    model = _build(name, dropout=0.5)
    assert _dropout_rates(model) == {0.5}
    x = torch.randn(4, *SMALL)
    assert not torch.equal(model(x), model(x))  # two dropout masks
    model.eval()
    assert torch.equal(model(x), model(x))


@pytest.mark.parametrize("name", MODELS)
def test_none_options_take_the_models_defaults(name):
    defaults = default_options(name)
    assert set(defaults) == {"dropout", "batchnorm"}
    model = _build(name)  # dropout=None, batchnorm=None
    assert _has_batchnorm(model) == defaults["batchnorm"]
    assert _dropout_rates(model) <= {defaults["dropout"]}


def test_chosen_defaults():
    # Faithful to the seed reports (A: no BN, dropout in the head; D: neither), modern nets with BN.
    assert default_options("simple_cnn") == {"dropout": 0.25, "batchnorm": False}
    assert default_options("vgg_small") == {"dropout": 0.0, "batchnorm": False}
    assert default_options("resnet18") == {"dropout": 0.0, "batchnorm": True}
    assert default_options("fastnet") == {"dropout": 0.0, "batchnorm": True}


@pytest.mark.parametrize("name", MODELS)
def test_same_seed_same_weights(name):
    torch.manual_seed(0)
    a = _build(name, width=1.0).state_dict()
    torch.manual_seed(0)
    b = _build(name, width=1.0).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    torch.manual_seed(1)
    c = _build(name, width=1.0).state_dict()
    assert not all(torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize("name", MODELS)
def test_eval_output_does_not_depend_on_the_batch(name):
    torch.manual_seed(0)
    model = _build(name, batchnorm=True, dropout=0.5)
    for _ in range(3):  # move the BN running statistics away from their initial values
        model(torch.randn(8, *SMALL))
    model.eval()
    x = torch.randn(5, *SMALL)
    rng_before = torch.random.get_rng_state()
    with torch.no_grad():
        full = model(x)
        one_by_one = torch.cat([model(x[i : i + 1]) for i in range(len(x))])
        perm = torch.randperm(len(x))
        shuffled = model(x[perm])
        rng_before_eval = torch.random.get_rng_state()
        model(x)
    assert not torch.equal(rng_before, rng_before_eval)  # only randperm above drew from the RNG
    assert torch.equal(rng_before_eval, torch.random.get_rng_state())  # eval forward draws nothing
    torch.testing.assert_close(one_by_one, full, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(shuffled, full[perm], atol=1e-5, rtol=1e-4)


def test_simple_cnn_parameter_count_by_hand():
    # 32x32x3 input, 10 classes; conv = Cin*Cout*3*3 weights + Cout biases.
    conv1 = 3 * 32 * 9 + 32  # 896
    conv2 = 32 * 64 * 9 + 64  # 18_496
    conv3 = 64 * 128 * 9 + 128  # 73_856
    fc1 = (128 * 4 * 4) * 256 + 256  # three 2x pools: 32 -> 4; 524_544
    fc2 = 256 * 10 + 10  # 2_570
    expected = conv1 + conv2 + conv3 + fc1 + fc2
    assert expected == 620_362
    model = create_model("simple_cnn", num_classes=10, batchnorm=False)
    assert count_params(model) == expected
    # With BatchNorm the conv biases go (redundant) and each BN adds a weight and a bias.
    with_bn = expected - (32 + 64 + 128) + 2 * (32 + 64 + 128)
    assert count_params(create_model("simple_cnn", num_classes=10, batchnorm=True)) == with_bn


def test_simple_cnn_flatten_size_on_odd_images():
    # ceil-mode pooling: 17 -> 9 -> 5 -> 3 and 23 -> 12 -> 6 -> 3.
    model = create_model("simple_cnn", num_classes=10, image_size=(17, 23))
    assert model.classifier[1].in_features == 128 * 3 * 3
    # Report A's 128x128 STL-10 images: 128 -> 16.
    model = create_model("simple_cnn", num_classes=10, image_size=128)
    assert model.classifier[1].in_features == 128 * 16 * 16


def test_vgg_small_matches_report_d():
    model = create_model("vgg_small", num_classes=10)
    assert model.classifier[1].in_features == 4096  # "Linear 4096->256->32->10"
    convs = 896 + 18_496 + 73_856 + (128 * 256 * 9 + 256) + 2 * (256 * 256 * 9 + 256)
    head = (4096 * 256 + 256) + (256 * 32 + 32) + (32 * 10 + 10)
    assert count_params(model) == convs + head == 2_625_962


def test_resnet18_has_the_usual_cifar_parameter_count():
    assert model_info("resnet18", num_classes=10)["params"] == 11_173_962


def test_simple_cnn_flops_by_hand():
    # FlopCounterMode counts only convolutions and matrix products, a multiply-add as 2:
    # conv = 2*Cin*Cout*k*k*Hout*Wout, linear = 2*in*out. Bias adds, ReLU, pooling and
    # dropout are not counted.
    conv1 = 2 * 3 * 32 * 9 * 32 * 32
    conv2 = 2 * 32 * 64 * 9 * 16 * 16
    conv3 = 2 * 64 * 128 * 9 * 8 * 8
    fc1 = 2 * 2048 * 256
    fc2 = 2 * 256 * 10
    expected = conv1 + conv2 + conv3 + fc1 + fc2
    assert expected == 21_697_536
    model = create_model("simple_cnn", num_classes=10)
    assert count_flops(model, (3, 32, 32)) == expected
    # BatchNorm is not counted, and it removes only the (uncounted) conv biases.
    bn_model = create_model("simple_cnn", num_classes=10, batchnorm=True)
    assert count_flops(bn_model, (3, 32, 32)) == expected


def test_count_flops_keeps_train_mode_and_grads_off():
    model = create_model("resnet18", num_classes=10, width=0.25)
    model.train()
    model.fc.eval()  # a mixed state must come back as it was
    count_flops(model, SMALL)
    assert model.training and model.stages.training and not model.fc.training
    assert all(p.grad is None for p in model.parameters())


def test_count_params_skips_frozen_parameters():
    model = create_model("simple_cnn", num_classes=10)
    total = count_params(model)
    model.features[0].weight.requires_grad_(False)
    assert count_params(model) == total - 3 * 32 * 9


def test_ddplab_models_counts_what_training_counts():
    """The whitening stem's weights are frozen from the start, not only once the data set them."""
    model = create_model("speednet", num_classes=10)
    assert not model.whitening.weight.requires_grad and model.whitening.bias.requires_grad
    assert model_info("speednet", num_classes=10)["params"] == count_params(model)


def test_the_models_list_and_a_training_run_count_the_same_parameters(tmp_path):
    from ddplab import train

    from support.settings import tiny_config

    run = train(tiny_config(tmp_path / "r", model={"name": "speednet", "width": 0.125}, train={"epochs": 1}))
    assert run.summary["model"]["params"] == model_info("speednet", num_classes=4, image_size=16, width=0.125)["params"]


def test_model_info_builds_nothing_real_and_leaves_the_rng_alone():
    rng = torch.random.get_rng_state()
    info = model_info("simple_cnn", num_classes=10, in_channels=1, image_size=(17, 23))
    assert torch.equal(rng, torch.random.get_rng_state())
    assert info["name"] == "simple_cnn"
    assert info["input_shape"] == (1, 17, 23)
    real = create_model("simple_cnn", num_classes=10, in_channels=1, image_size=(17, 23))
    assert info["params"] == count_params(real)
    assert info["flops"] == count_flops(real, (1, 17, 23))


def test_describe_models_lists_every_model():
    rows = describe_models(image_size=32, num_classes=10)
    assert [r["name"] for r in rows] == MODELS
    for row in rows:
        assert row["params"] > 0 and row["flops"] > 0
        assert row["input_shape"] == (3, 32, 32)
        assert row["defaults"] == default_options(row["name"])


def test_unknown_model_names_the_registered_ones():
    with pytest.raises(ConfigError) as info:
        create_model("resnet19", num_classes=10)
    for name in MODELS:
        assert name in str(info.value)
    assert "did you mean 'resnet18'" in str(info.value)
    assert info.value.exit_code == 2
    with pytest.raises(ConfigError):
        model_info("nope", num_classes=10)


@pytest.mark.parametrize(
    "option,value",
    [
        ("width", 0),
        ("width", -1.0),
        ("width", math.nan),
        ("dropout", 1.0),
        ("dropout", -0.1),
        ("image_size", 0),
        ("image_size", (32, 0)),
        ("image_size", (32,)),
        ("image_size", "32"),
        ("num_classes", 0),
        ("in_channels", 0),
        ("batchnorm", "yes"),
    ],
)
def test_bad_options_are_config_errors_naming_the_option(option, value):
    kwargs = {"num_classes": 10, option: value}
    with pytest.raises(ConfigError, match=option):
        create_model("simple_cnn", **kwargs)


@pytest.mark.parametrize("name", ["simple_cnn", "vgg_small"])
def test_flattening_nets_reject_another_image_size_clearly(name):
    model = create_model(name, num_classes=10, image_size=32)
    with pytest.raises(ValueError, match="image_size"):
        model(torch.zeros(1, 3, 28, 28))


def test_register_model_rejects_duplicates_and_bad_builders():
    with pytest.raises(ValueError, match="already registered"):
        register_model("simple_cnn")(lambda **kw: nn.Identity())

    def no_options(*, num_classes):
        return nn.Identity()

    with pytest.raises(TypeError, match="in_channels"):
        register_model("broken")(no_options)
    assert "broken" not in list_models()


@pytest.mark.parametrize("name", list_models())
def test_count_flops_agrees_with_flop_counter_mode(name):
    from torch.utils.flop_counter import FlopCounterMode

    model = create_model(name, num_classes=10, image_size=(17, 23), width=0.25)
    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.zeros(1, 3, 17, 23))
    assert count_flops(model, (3, 17, 23)) == counter.get_total_flops()


def test_layers_are_listed_in_forward_order_with_repeats_folded():
    from ddplab.models import describe_layers

    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2),
        nn.ReLU(),
        nn.ReLU(),
        nn.Sequential(nn.MaxPool2d(2), nn.Flatten()),
        nn.Identity(),
        nn.Dropout(0.5),
        nn.Linear(8, 2),
    )
    assert describe_layers(model) == "Conv3x3(3->8, stride 2) > ReLU x2 > MaxPool2 > Dropout(0.5) > Linear(8->2)"
