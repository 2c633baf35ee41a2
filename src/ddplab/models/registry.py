"""Build any classifier by name, and count its parameters and FLOPs.

A model family registers a *builder* with `@register_model("name")`. Every builder takes
the same keyword-only options (`num_classes`, `in_channels`, `image_size` as an (H, W)
tuple, `width`, `dropout`, `batchnorm`) and declares its own defaults for `dropout` and
`batchnorm` in its signature. `create_model` checks the options once, here, so builders can
trust them, and passes `dropout`/`batchnorm` only when the caller set them (None means "the
model's own default").

FLOP convention (`count_flops`, `model_info`, `describe_models`): forward FLOPs for ONE
image, as counted by `torch.utils.flop_counter.FlopCounterMode` in eval mode. A multiply-add
is 2 FLOPs. Only matmul-like ops are counted: convolutions (2*Cin/groups*Cout*kh*kw*Hout*Wout)
and matrix products (a Linear is 2*in*out); bias adds, normalization, activations, pooling,
dropout and the residual adds are not. This is the convention of fvcore/ptflops style tables
times two, so "GFLOPs" here is twice the "GMACs" those tables print.
"""

from __future__ import annotations

import difflib
import inspect
import itertools
import math
import numbers
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ddplab.errors import ConfigError

ModelBuilder = Callable[..., nn.Module]

# The options every builder accepts, keyword-only; the last two carry per-model defaults.
_OPTIONS = ("num_classes", "in_channels", "image_size", "width", "dropout", "batchnorm")
_MODEL_DEFAULTS = ("dropout", "batchnorm")
_REGISTRY: dict[str, ModelBuilder] = {}


def register_model(name: str) -> Callable[[ModelBuilder], ModelBuilder]:
    """Register a builder under `name`; it must take every option in `_OPTIONS` keyword-only."""

    def decorator(builder: ModelBuilder) -> ModelBuilder:
        if name in _REGISTRY:
            owner = _REGISTRY[name].__module__
            raise ValueError(f"model {name!r} is already registered (by {owner})")
        params = inspect.signature(builder).parameters
        for option in _OPTIONS:
            param = params.get(option)
            if param is None or param.kind is not inspect.Parameter.KEYWORD_ONLY:
                raise TypeError(f"builder {builder.__qualname__} must take keyword-only {option!r}")
            if option in _MODEL_DEFAULTS and param.default is inspect.Parameter.empty:
                raise TypeError(f"builder {builder.__qualname__} must give {option!r} a default")
        _REGISTRY[name] = builder
        return builder

    return decorator


def list_models() -> list[str]:
    """Names of the registered models, sorted."""
    return sorted(_REGISTRY)


def _get_builder(name: str) -> ModelBuilder:
    try:
        return _REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), _REGISTRY, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"unknown model {name!r}{hint}; registered models: {', '.join(list_models())}") from None


def default_options(name: str) -> dict[str, Any]:
    """The model's own defaults for the options left to it (`dropout`, `batchnorm`)."""
    params = inspect.signature(_get_builder(name)).parameters
    return {option: params[option].default for option in _MODEL_DEFAULTS}


def check_image_size(model: nn.Module, x: torch.Tensor) -> None:
    """Nets with a flattening head are built for one image size: say so instead of a shape error."""
    if tuple(x.shape[-2:]) != model.image_size:
        raise ValueError(
            f"{type(model).__name__} was built for images of {model.image_size} but got "
            f"{tuple(x.shape[-2:])}: set the model's image_size to the data's"
        )


def create_model(
    name: str,
    *,
    num_classes: int,
    in_channels: int = 3,
    image_size: int | tuple[int, int] = 32,
    width: float = 1.0,
    dropout: float | None = None,
    batchnorm: bool | None = None,
) -> nn.Module:
    """Build the registered model `name`, with fresh parameters drawn from the global RNG.

    `image_size` is H (square) or (H, W); nets with a flattening head are built for exactly
    that size. `width` multiplies every hidden channel and unit count. `dropout` and
    `batchnorm` left at None take the model's own default (`default_options(name)`).
    Raises `ConfigError` for an unknown name or an invalid option.
    """
    builder = _get_builder(name)
    options: dict[str, Any] = {
        "num_classes": _check_int("num_classes", num_classes, minimum=1),
        "in_channels": _check_int("in_channels", in_channels, minimum=1),
        "image_size": _check_image_size(image_size),
        "width": _check_width(width),
    }
    if dropout is not None:
        options["dropout"] = _check_dropout(dropout)
    if batchnorm is not None:
        if not isinstance(batchnorm, bool):
            raise ConfigError(f"model option batchnorm={batchnorm!r} is not valid: must be true or false")
        options["batchnorm"] = batchnorm
    return builder(**options)


def count_params(model: nn.Module) -> int:
    """Number of trainable parameters (shared ones counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _layer_flops(module: nn.Module, output: torch.Tensor) -> int:
    """FLOPs of one Conv2d / Linear call, a multiply-add counted as 2."""
    if isinstance(module, nn.Conv2d):
        kh, kw = module.kernel_size
        per_output = 2 * (module.in_channels // module.groups) * kh * kw
        return per_output * output.numel()
    if isinstance(module, nn.Linear):
        return 2 * module.in_features * output.numel()
    return 0


def count_flops(model: nn.Module, input_shape: tuple[int, int, int]) -> int:
    """Forward FLOPs for one image of shape (C, H, W); see the module docstring for what counts.

    Counts convolutions and linear layers through forward hooks on one forward pass of a
    zero image (eval mode, no autograd; a model on the "meta" device costs no compute).
    This agrees with torch.utils.flop_counter.FlopCounterMode on every registered model
    (tested) without importing torch._dynamo, which costs seconds at start-up.
    """
    shape = tuple(int(s) for s in input_shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"input_shape must be (C, H, W) with positive sizes, got {input_shape!r}")
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    x = torch.zeros((1, *shape), device=device, dtype=dtype)
    total = 0

    def hook(module: nn.Module, args, output: torch.Tensor) -> None:
        nonlocal total
        total += _layer_flops(module, output)

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
        for module, training in modes:
            module.training = training
    return total


def describe_layers(model: nn.Module) -> str:
    """The model's layers in forward order, one short token each, repeats folded ("ReLU x2"):
    the architecture line of a run's summary and report."""
    tokens: list[str] = []
    for module in model.modules():
        if next(module.children(), None) is not None or isinstance(module, (nn.Identity, nn.Flatten)):
            continue  # containers, and layers that compute nothing
        tokens.append(_layer_token(module))
    folded = [(token, len(list(run))) for token, run in itertools.groupby(tokens)]
    return " > ".join(t if n == 1 else f"{t} x{n}" for t, n in folded)


def _layer_token(m: nn.Module) -> str:
    if isinstance(m, nn.Conv2d):
        k, s = m.kernel_size, m.stride
        return f"Conv{k[0]}x{k[1]}({m.in_channels}->{m.out_channels}{f', stride {s[0]}' if s[0] != 1 else ''})"
    if isinstance(m, nn.Linear):
        return f"Linear({m.in_features}->{m.out_features})"
    if isinstance(m, (nn.MaxPool2d, nn.AvgPool2d)):
        return f"{type(m).__name__.removesuffix('2d')}{m.kernel_size}"
    if isinstance(m, nn.Dropout):
        return f"Dropout({m.p:g})"
    return type(m).__name__.removesuffix("2d")


def model_info(
    name: str,
    *,
    num_classes: int,
    in_channels: int = 3,
    image_size: int | tuple[int, int] = 32,
    width: float = 1.0,
    dropout: float | None = None,
    batchnorm: bool | None = None,
) -> dict[str, Any]:
    """`{name, params, flops, input_shape}` for a model built with these options.

    The model is built on the "meta" device: no memory, no compute, and the global RNG is
    left untouched, so this is safe to call between seeding and building the real model.
    """
    with torch.device("meta"):
        model = create_model(
            name,
            num_classes=num_classes,
            in_channels=in_channels,
            image_size=image_size,
            width=width,
            dropout=dropout,
            batchnorm=batchnorm,
        )
    input_shape = (int(in_channels), *_check_image_size(image_size))
    return {
        "name": name,
        "params": count_params(model),
        "flops": count_flops(model, input_shape),
        "input_shape": input_shape,
    }


def describe_models(
    image_size: int | tuple[int, int] = 32, num_classes: int = 10, in_channels: int = 3
) -> list[dict[str, Any]]:
    """One row per registered model for `ddplab models`: name, params, flops (forward, per
    image), input_shape and the model's default options (width 1)."""
    rows = []
    for name in list_models():
        info = model_info(name, num_classes=num_classes, in_channels=in_channels, image_size=image_size)
        rows.append({**info, "defaults": default_options(name)})
    return rows


# ---- helpers shared by the model families -------------------------------------------------


def scale_channels(channels: int, width: float) -> int:
    """`channels` times the width multiplier, rounded, at least 1."""
    return max(1, int(round(channels * width)))


def pooled_size(size: int, num_pools: int) -> int:
    """Spatial size after `num_pools` 2x2/stride-2 max pools with ceil_mode=True.

    ceil_mode keeps the last, partial window on odd sizes instead of dropping that row or
    column, so no pixel is discarded and the size never reaches 0 (7 -> 4 -> 2 -> 1, and
    1 stays 1). On even sizes it is the same as the usual floor mode.
    """
    for _ in range(num_pools):
        size = (size + 1) // 2
    return size


def norm2d(channels: int, batchnorm: bool) -> nn.Module:
    """BatchNorm2d with PyTorch's defaults, or Identity when batchnorm is off."""
    return nn.BatchNorm2d(channels) if batchnorm else nn.Identity()


# ---- option checks (messages name the option, the value and what is allowed) --------------


def _check_int(option: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ConfigError(f"model option {option}={value!r} is not valid: must be an integer >= {minimum}")
    return int(value)


def _check_image_size(image_size: Any) -> tuple[int, int]:
    hw = (image_size, image_size) if isinstance(image_size, numbers.Integral) else image_size
    if (
        isinstance(image_size, bool)
        or not isinstance(hw, (tuple, list))
        or len(hw) != 2
        or any(isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 1 for s in hw)
    ):
        raise ConfigError(
            f"model option image_size={image_size!r} is not valid: must be an integer >= 1 or [height, width]"
        )
    return int(hw[0]), int(hw[1])


def _check_width(width: Any) -> float:
    if isinstance(width, bool) or not isinstance(width, numbers.Real) or not math.isfinite(width) or width <= 0:
        raise ConfigError(f"model option width={width!r} is not valid: must be a number > 0")
    return float(width)


def _check_dropout(dropout: Any) -> float:
    if (
        isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0 <= dropout < 1  # type: ignore[operator]  # numbers.Real's stub has no reflected comparisons
    ):
        raise ConfigError(f"model option dropout={dropout!r} is not valid: must be in [0, 1)")
    return float(dropout)
