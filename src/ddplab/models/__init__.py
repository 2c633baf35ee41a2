"""Image classifiers, built by name: `create_model("resnet18", num_classes=10)`.

Importing this package registers every family below. Models hold no training or
parallelism code; the trainer seeds the global RNG before building one.
"""

from ddplab.models import fastnet, resnet, simple_cnn, vgg  # noqa: F401  (self-registration)
from ddplab.models.registry import (
    count_flops,
    count_params,
    create_model,
    default_options,
    describe_layers,
    describe_models,
    list_models,
    model_info,
    register_model,
)

__all__ = [
    "count_flops",
    "count_params",
    "create_model",
    "default_options",
    "describe_layers",
    "describe_models",
    "list_models",
    "model_info",
    "register_model",
]
