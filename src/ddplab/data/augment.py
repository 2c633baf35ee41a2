"""Batched image augmentation on the training device.

Every op works on a whole float batch [B, C, H, W] at once (no Python loop over samples),
so augmenting costs a few kernel launches per batch instead of B small ones, and the data
never leaves the device. Randomness comes only from the `torch.Generator` passed in (it
must live on the batch's device), drawn in a fixed order, so an augmented batch is a pure
function of (input, generator state) -- what makes runs and resumes reproducible.

Order of ops, and of random draws (a disabled op draws nothing):

1. crop       `randint(0, 2p+1, (2, B))`: row then column window offsets in the padded image
2. translate  `randint(0, 2t+1, (2, B))`: same code, zero padding
3. flip       `rand(B)`: mirror where < 0.5 (flip_mode "alternate": no draw, the loader's mask)
4. rotate     `rand(B)`: angle = d * (2u - 1) degrees
5. jitter     `rand(3, B)`: brightness, contrast, saturation factors 1 + s * (2u - 1)
   -- then the loader normalizes with the dataset's mean/std --
6. cutout     `randint(0, H, (B,))` then `randint(0, W, (B,))`: square centres

Steps 1-5 are `Augmenter.__call__` on [0, 1] pixels; step 6 is `Augmenter.apply_cutout` on
the normalized batch, so the zero fill is the mean colour.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ddplab.data.options import FLIP_MODES
from ddplab.errors import ConfigError

PAD_MODES = ("reflect", "zeros")
# ITU-R 601 luma weights, as torchvision's rgb_to_grayscale uses.
_LUMA = (0.299, 0.587, 0.114)


@dataclass
class AugmentSpec:
    """What to do to each training image; every default is off."""

    crop_padding: int = 0  # pixels of padding before a random crop back to H x W
    pad_mode: str = "reflect"  # padding for the crop: "reflect" or "zeros"
    translate: int = 0  # random shift by up to +-t pixels, zero fill
    flip: bool = False  # horizontal mirror with p = 0.5
    flip_mode: str = "random"  # "alternate": which images to mirror comes from the loader (see DeviceLoader)
    cutout: int = 0  # side in pixels of one zeroed square per image (after normalization)
    jitter: float = 0.0  # brightness/contrast/saturation factors uniform in [1-s, 1+s]
    rotate: float = 0.0  # max degrees; angle uniform in [-d, d], bilinear, zero fill

    def __post_init__(self) -> None:
        for name in ("crop_padding", "translate", "cutout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"data.{name} must be an integer >= 0 (pixels), got {value!r}")
        if self.flip_mode not in FLIP_MODES:
            raise ConfigError(f"data.flip_mode must be one of {FLIP_MODES}, got {self.flip_mode!r}")
        if self.pad_mode not in PAD_MODES:
            raise ConfigError(f"AugmentSpec.pad_mode must be one of {PAD_MODES}, got {self.pad_mode!r}")
        if not 0.0 <= self.jitter < 1.0:  # the same rule as DataConfig's: factors stay > 0
            raise ConfigError(f"data.jitter must be in [0, 1), got {self.jitter!r}")
        if not 0.0 <= self.rotate <= 180.0:
            raise ConfigError(f"data.rotate must be in [0, 180] degrees, got {self.rotate!r}")

    def is_identity(self) -> bool:
        return not (self.crop_padding or self.translate or self.flip or self.cutout or self.jitter or self.rotate)


def random_crop(x: torch.Tensor, padding: int, generator: torch.Generator, mode: str = "reflect") -> torch.Tensor:
    """Random H x W window of the batch padded by `padding`, at an offset in [0, 2p] per image.

    The padding is never materialized: window coordinates are mapped back into the image
    (mirrored for "reflect", masked for "zeros") and read with one gather, which is about
    1.6x faster on CPU than F.pad + gather and gives the same pixels.
    """
    if padding == 0:
        return x
    b, _, h, w = x.shape
    if mode == "reflect" and padding >= min(h, w):
        raise ConfigError(f"data.crop_padding={padding} needs images larger than it for reflect padding, got {h}x{w}")
    offsets = torch.randint(0, 2 * padding + 1, (2, b), generator=generator, device=x.device) - padding
    rows = offsets[0][:, None] + torch.arange(h, device=x.device)  # [B, H] source rows, maybe outside
    cols = offsets[1][:, None] + torch.arange(w, device=x.device)  # [B, W]
    if mode == "reflect":
        return gather_pixels(x, _mirror(rows, h), _mirror(cols, w))
    inside = ((rows >= 0) & (rows < h))[:, :, None] & ((cols >= 0) & (cols < w))[:, None, :]
    return gather_pixels(x, rows.clamp(0, h - 1), cols.clamp(0, w - 1)) * _as_mask(inside, x)


def _as_mask(keep: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """[B, H, W] bool -> [B, 1, H, W] 0/1 in x's dtype: multiplying by it is ~10x faster on CPU
    than a broadcast masked_fill (zeros of negative pixels come out as -0.0, equal to 0)."""
    return keep[:, None].to(x.dtype)


def _mirror(i: torch.Tensor, n: int) -> torch.Tensor:
    """Reflect indices into [0, n) without repeating the edge, as F.pad's "reflect" (needs |i| < 2n - 1)."""
    i = i.abs()
    return torch.where(i >= n, 2 * (n - 1) - i, i)


def gather_pixels(x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """out[b, c, i, j] = x[b, c, rows[b, i], cols[b, j]], as one gather over flattened images."""
    b, c, h, w = x.shape
    flat = (rows[:, :, None] * w + cols[:, None, :]).view(b, 1, -1).expand(b, c, -1)
    return x.reshape(b, c, h * w).gather(2, flat).view(b, c, rows.shape[1], cols.shape[1])


def random_flip(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Mirror each image left-right with probability 0.5."""
    mirror = torch.rand(x.shape[0], generator=generator, device=x.device) < 0.5
    return torch.where(mirror[:, None, None, None], x.flip(3), x)


def rotate(x: torch.Tensor, degrees: torch.Tensor) -> torch.Tensor:
    """Rotate image b by degrees[b] about its centre (positive = counter-clockwise on screen).

    The affine matrix works in grid_sample's [-1, 1] coordinates, so the off-diagonal terms
    carry the aspect ratio: without it a non-square image would shear instead of turn.
    """
    b, c, h, w = x.shape
    angle = torch.deg2rad(degrees.to(device=x.device, dtype=torch.float32))
    cos, sin = angle.cos(), angle.sin()
    theta = torch.zeros(b, 2, 3, device=x.device, dtype=torch.float32)
    theta[:, 0, 0] = cos
    theta[:, 0, 1] = -sin * (h / w)
    theta[:, 1, 0] = sin * (w / h)
    theta[:, 1, 1] = cos
    grid = F.affine_grid(theta, [b, c, h, w], align_corners=False).to(x.dtype)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def random_rotate(x: torch.Tensor, max_degrees: float, generator: torch.Generator) -> torch.Tensor:
    if max_degrees == 0:
        return x
    u = torch.rand(x.shape[0], generator=generator, device=x.device)
    return rotate(x, max_degrees * (2 * u - 1))


def _gray(x: torch.Tensor) -> torch.Tensor:
    if x.shape[1] == 3:
        r, g, b = x.unbind(1)
        return (_LUMA[0] * r + _LUMA[1] * g + _LUMA[2] * b).unsqueeze(1)
    return x.mean(dim=1, keepdim=True)


def color_jitter(x: torch.Tensor, strength: float, generator: torch.Generator) -> torch.Tensor:
    """Brightness, then contrast, then saturation, each clamped to [0, 1] (torchvision's blends).

    Factors are drawn in float32 whatever x's dtype, so the draws do not depend on precision.
    """
    if strength == 0:
        return x
    u = torch.rand(3, x.shape[0], generator=generator, device=x.device)
    f = (1 + strength * (2 * u - 1)).to(x.dtype).view(3, -1, 1, 1, 1)
    x = (x * f[0]).clamp_(0, 1)
    mean = _gray(x).mean(dim=(1, 2, 3), keepdim=True)
    x = torch.lerp(mean, x, f[1]).clamp_(0, 1)  # mean + f * (x - mean)
    gray = _gray(x)
    return torch.lerp(gray, x, f[2]).clamp_(0, 1)


def cutout(x: torch.Tensor, size: int, generator: torch.Generator) -> torch.Tensor:
    """Zero one size x size square per image around a uniform random pixel, clipped at the border."""
    if size == 0:
        return x
    b, _, h, w = x.shape
    cy = torch.randint(0, h, (b,), generator=generator, device=x.device)
    cx = torch.randint(0, w, (b,), generator=generator, device=x.device)
    top, left = (cy - size // 2)[:, None], (cx - size // 2)[:, None]
    rows, cols = torch.arange(h, device=x.device), torch.arange(w, device=x.device)
    out_rows = (rows < top) | (rows >= top + size)  # [B, H]
    out_cols = (cols < left) | (cols >= left + size)  # [B, W]
    return x * _as_mask(out_rows[:, :, None] | out_cols[:, None, :], x)


class Augmenter:
    """Applies an AugmentSpec to float batches; see the module docstring for the order."""

    def __init__(self, spec: AugmentSpec) -> None:
        self.spec = spec

    def __call__(self, x: torch.Tensor, generator: torch.Generator, mirror: torch.Tensor | None = None) -> torch.Tensor:
        """Steps 1-5 on pixels in [0, 1]; returns a new tensor, x is left untouched.

        `mirror` ([B] bool) says which images to flip when flip_mode is "alternate"."""
        if not x.is_floating_point() or x.dim() != 4:
            raise ValueError(f"Augmenter wants a float batch [B, C, H, W], got {x.dtype} {tuple(x.shape)}")
        s = self.spec
        out = random_crop(x, s.crop_padding, generator, s.pad_mode)
        out = random_crop(out, s.translate, generator, "zeros")
        if s.flip and s.flip_mode == "alternate":
            if mirror is None:
                raise ValueError("flip_mode='alternate' needs the loader's mirror mask")
            out = torch.where(mirror[:, None, None, None], out.flip(3), out)
        elif s.flip:
            out = random_flip(out, generator)
        out = random_rotate(out, s.rotate, generator)
        out = color_jitter(out, s.jitter, generator)
        return out.clone() if out is x else out

    def apply_cutout(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Step 6, on the normalized batch, so the square is the dataset's mean colour."""
        return cutout(x, self.spec.cutout, generator)
