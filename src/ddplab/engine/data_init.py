"""Initialization from the training data: the patch-whitening stem of the speedrun preset.

A model that wants it exposes a `whitening` Conv2d with 2 x d output channels, d = C x k x k
for k x k patches. Its weights are set so that, on the training images as the loader
presents them (scaled to [0, 1], normalized, no augmentation), the first d channels output
the patches' principal components with unit variance and the other d their negatives;
the bias subtracts the patch mean. The model keeps the weights frozen (the optimizer skips
them) and trains the bias.

Every rank computes the same numbers from the same images, and DDP broadcasts rank 0's
parameters anyway, so ranks agree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ddplab.data.dataset import ImageDataset
from ddplab.data.loader import DeviceLoader

WHITENING_IMAGES = 5000  # the first N training images: enough for a stable d x d covariance (d = 12 on RGB)
WHITENING_EPS = 5e-4  # added to the eigenvalues: directions with almost no variance are not blown up


def wants_data_init(model: torch.nn.Module) -> bool:
    return isinstance(getattr(model, "whitening", None), torch.nn.Conv2d)


@torch.no_grad()
def init_whitening(
    conv: torch.nn.Conv2d,
    data: ImageDataset,
    device: torch.device | str = "cpu",
    num_images: int = WHITENING_IMAGES,
    eps: float = WHITENING_EPS,
) -> None:
    """Set `conv` to whiten k x k patches of `data`'s first `num_images` training images."""
    c, k = conv.in_channels, conv.kernel_size[0]
    d = c * k * k
    if conv.out_channels != 2 * d or conv.kernel_size[0] != conv.kernel_size[1] or conv.groups != 1:
        raise ValueError(f"a whitening conv needs 2 x C x k x k = {2 * d} outputs and square k x k kernels, got {conv}")
    x, _ = next(iter(DeviceLoader(data, batch_size=num_images, device=device, train=False)))  # the first N, normalized
    patches = F.unfold(x, kernel_size=k).transpose(1, 2).reshape(-1, d).double()  # [N x L, C*k*k]
    center = patches.mean(dim=0)
    centered = patches - center
    covariance = centered.T @ centered / len(patches)
    eigenvalues, eigenvectors = torch.linalg.eigh(covariance)  # ascending; columns are the directions
    filters = (eigenvectors / (eigenvalues.clamp(min=0) + eps).sqrt()).T  # row i: direction i, unit output variance
    weight = torch.cat([filters, -filters])  # [2d, d]
    conv.weight.copy_(weight.view(2 * d, c, k, k).to(conv.weight))
    if conv.bias is not None:
        conv.bias.copy_((-weight @ center).to(conv.bias))
