"""Each augmentation: reproducible from the generator, shape/dtype/range kept, and doing what it says."""

import pytest
import torch
import torch.nn.functional as F

from ddplab.data.augment import (
    Augmenter,
    AugmentSpec,
    color_jitter,
    cutout,
    random_crop,
    random_flip,
    random_rotate,
    rotate,
)
from ddplab.errors import ConfigError

# One spec per op, each applied through the Augmenter as the loader does.
SPECS = {
    "crop_reflect": AugmentSpec(crop_padding=4),
    "crop_zeros": AugmentSpec(crop_padding=4, pad_mode="zeros"),
    "translate": AugmentSpec(translate=3),
    "flip": AugmentSpec(flip=True),
    "rotate": AugmentSpec(rotate=20.0),
    "jitter": AugmentSpec(jitter=0.4),
    "cutout": AugmentSpec(cutout=8),
    "all": AugmentSpec(crop_padding=2, translate=1, flip=True, rotate=10.0, jitter=0.3, cutout=6),
}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def batch(n: int = 16, c: int = 3, h: int = 12, w: int = 10, seed: int = 0) -> torch.Tensor:
    return torch.rand(n, c, h, w, generator=gen(seed))


def full(spec: AugmentSpec, x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    aug = Augmenter(spec)
    return aug.apply_cutout(aug(x, g), g)


@pytest.mark.parametrize("name", list(SPECS))
def test_deterministic_given_generator(name):
    x = batch(32)
    a = full(SPECS[name], x, gen(1))
    b = full(SPECS[name], x, gen(1))
    c = full(SPECS[name], x, gen(2))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("name", list(SPECS))
def test_keeps_shape_dtype_range_and_input(name):
    x = batch(16)
    before = x.clone()
    y = Augmenter(SPECS[name])(x, gen(0))
    assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device
    assert y.min() >= 0 and y.max() <= 1
    assert torch.equal(x, before), "the input must not be modified"
    assert y.data_ptr() != x.data_ptr()


def test_identity_spec_leaves_data_unchanged():
    spec = AugmentSpec()
    assert spec.is_identity()
    assert not AugmentSpec(flip=True).is_identity()
    x = batch()
    y = full(spec, x, gen(0))
    assert torch.equal(x, y) and y.data_ptr() != x.data_ptr()


@pytest.mark.parametrize(
    "kwargs, names",
    [
        (dict(crop_padding=-1), "data.crop_padding"),
        (dict(cutout=2.5), "data.cutout"),
        (dict(jitter=1.5), "data.jitter"),
        (dict(jitter=1.0), "data.jitter"),  # the same bound as DataConfig's: [0, 1)
        (dict(pad_mode="edge"), "AugmentSpec.pad_mode"),
    ],
)
def test_bad_spec_is_a_config_error_naming_the_setting(kwargs, names):
    """Messages name the setting a user can change (REVIEW: they named flags that do not exist)."""
    with pytest.raises(ConfigError, match=names.replace(".", r"\.")):
        AugmentSpec(**kwargs)


def test_reflect_padding_larger_than_image_is_refused():
    with pytest.raises(ConfigError, match="crop_padding"):
        random_crop(torch.rand(2, 3, 4, 4), 4, gen(0))


@pytest.mark.parametrize("mode,torch_mode", [("reflect", "reflect"), ("zeros", "constant")])
def test_crop_is_a_window_of_the_padded_image(mode, torch_mode):
    p, x = 3, batch(8)
    y = random_crop(x, p, gen(5), mode)
    xp = F.pad(x, (p,) * 4, mode=torch_mode)
    h, w = x.shape[-2:]
    offsets = set()
    for i in range(len(x)):
        hits = [
            (dy, dx)
            for dy in range(2 * p + 1)
            for dx in range(2 * p + 1)
            if torch.equal(y[i], xp[i, :, dy : dy + h, dx : dx + w])
        ]
        assert hits, f"image {i} is no window of its padded input"
        offsets.add(hits[0])
    assert len(offsets) > 1, "every image got the same offset"


def test_translate_is_a_zero_filled_shift():
    t, x = 2, batch(8) + 0.5  # no zeros inside, so zero fill is visible
    y = Augmenter(AugmentSpec(translate=t))(x, gen(3))
    h, w = x.shape[-2:]
    xp = F.pad(x, (t,) * 4)
    for i in range(len(x)):
        assert any(
            torch.equal(y[i], xp[i, :, dy : dy + h, dx : dx + w]) for dy in range(2 * t + 1) for dx in range(2 * t + 1)
        )


@pytest.mark.parametrize(
    "p,h,w,mode",
    [(4, 16, 16, "reflect"), (4, 16, 16, "zeros"), (4, 5, 6, "reflect"), (7, 5, 6, "zeros"), (1, 3, 9, "reflect")],
)
def test_batched_crop_matches_a_per_sample_loop(p, h, w, mode):
    """4096 images cropped in one call, against F.pad and a loop that replays the documented draws."""
    x = torch.rand(4096, 3, h, w, generator=gen(0))
    y = random_crop(x, p, gen(9), mode)
    offsets = torch.randint(0, 2 * p + 1, (2, len(x)), generator=gen(9))
    xp = F.pad(x, (p,) * 4, mode="reflect" if mode == "reflect" else "constant")
    ref = torch.stack([xp[i, :, t : t + h, left : left + w] for i, (t, left) in enumerate(offsets.T.tolist())])
    assert torch.equal(y, ref)


def test_flip_mirrors_some_and_keeps_others():
    x = batch(64)
    y = random_flip(x, gen(0))
    same = (y == x).flatten(1).all(1)
    mirrored = (y == x.flip(3)).flatten(1).all(1)
    assert (same | mirrored).all()
    assert same.any() and mirrored.any()


def test_cutout_zeros_one_clipped_square_per_image():
    s, x = 6, batch(64, h=16, w=16) + 0.5  # no zeros outside the square
    y = cutout(x, s, gen(0))
    assert y.shape == x.shape
    clipped = 0
    for i in range(len(x)):
        zero = (y[i] == 0).all(0)  # [H, W]; the square covers all channels
        assert ((y[i] == 0) == zero).all(), "square must cover every channel"
        rows, cols = zero.any(1).nonzero().flatten(), zero.any(0).nonzero().flatten()
        assert len(rows) and len(cols), "every image gets a square (its centre is inside)"
        r0, r1, c0, c1 = rows.min(), rows.max() + 1, cols.min(), cols.max() + 1
        assert r1 - r0 <= s and c1 - c0 <= s
        assert zero[r0:r1, c0:c1].all() and zero.sum() == (r1 - r0) * (c1 - c0), "a filled rectangle"
        keep = ~zero
        assert torch.equal(y[i][:, keep], x[i][:, keep]), "outside the square nothing changes"
        full_size = (r1 - r0 == s) and (c1 - c0 == s)
        at_border = r0 == 0 or c0 == 0 or r1 == 16 or c1 == 16
        assert full_size or at_border, "only the border may clip the square"
        clipped += not full_size
    assert clipped > 0, "with 64 images some squares should overlap the border"


def test_cutout_fills_the_mean_colour_after_normalization():
    """The loader order: normalize, then cutout, so zero is the dataset mean."""
    mean = torch.tensor([0.4, 0.5, 0.6]).view(1, 3, 1, 1)
    x = (batch(4, h=16, w=16) - mean) / 0.25
    y = Augmenter(AugmentSpec(cutout=4)).apply_cutout(x, gen(0))
    restored = y * 0.25 + mean
    hole = (y == 0).all(1, keepdim=True).expand_as(y)
    assert hole.any()
    assert torch.allclose(restored[hole], mean.expand_as(y)[hole])


def test_jitter_zero_is_identity_and_positive_stays_in_range():
    x = batch(32)
    assert torch.equal(color_jitter(x, 0.0, gen(0)), x)
    y = color_jitter(x, 0.9, gen(0))
    assert y.min() >= 0 and y.max() <= 1
    assert not torch.allclose(y, x)


def test_jitter_brightness_factor_matches_the_draw():
    """A gray image has no contrast or saturation to change: only brightness scales it."""
    x = torch.full((8, 3, 4, 4), 0.5)
    y = color_jitter(x, 0.5, gen(4))
    u = torch.rand(3, 8, generator=gen(4))
    expected = (0.5 * (1 + 0.5 * (2 * u[0] - 1))).view(8, 1, 1, 1).expand_as(x)
    assert torch.allclose(y, expected, atol=1e-6)


def test_jitter_matches_a_per_image_reference():
    """torchvision's blends, one image at a time: brightness, contrast, saturation, clamp after each."""
    x = batch(16)
    y = color_jitter(x, 0.9, gen(6))
    f = 1 + 0.9 * (2 * torch.rand(3, 16, generator=gen(6)) - 1)
    luma = torch.tensor([0.299, 0.587, 0.114]).view(3, 1, 1)
    for i in range(16):
        img = (x[i] * f[0, i]).clamp(0, 1)
        m = (img * luma).sum(0).mean()
        img = (m + f[1, i] * (img - m)).clamp(0, 1)
        gray = (img * luma).sum(0, keepdim=True)
        img = (gray + f[2, i] * (img - gray)).clamp(0, 1)
        assert torch.allclose(y[i], img, atol=1e-6)
    assert (x * f[0].view(16, 1, 1, 1) > 1).any(), "the test should exercise clamping"


def test_jitter_on_one_channel_images():
    x = batch(8, c=1)
    y = color_jitter(x, 0.5, gen(0))
    assert y.shape == x.shape and y.min() >= 0 and y.max() <= 1


def test_rotate_by_zero_is_identity():
    x = batch(8)
    assert torch.allclose(rotate(x, torch.zeros(8)), x, atol=1e-6)


def test_rotate_quarter_turn_is_rot90_and_keeps_aspect():
    x = batch(4, h=8, w=8)
    assert torch.allclose(rotate(x, torch.full((4,), 90.0)), torch.rot90(x, 1, dims=(2, 3)), atol=1e-5)
    wide = batch(4, h=6, w=10)
    assert torch.allclose(rotate(wide, torch.full((4,), 180.0)), wide.flip(2, 3), atol=1e-5)


def test_rotate_quarter_turn_of_a_wide_image_turns_its_centre_square():
    """In grid coordinates a wide image needs the aspect ratio in the matrix, or it shears."""
    wide = batch(4, h=6, w=10)
    y = rotate(wide, torch.full((4,), 90.0))
    assert torch.allclose(y[..., 2:8], torch.rot90(wide[..., 2:8], 1, dims=(2, 3)), atol=1e-5)


def test_rotate_keeps_a_constant_interior_constant():
    x = torch.full((16, 3, 32, 32), 0.7)
    y = random_rotate(x, 30.0, gen(0))
    yy, xx = torch.meshgrid(torch.arange(32) - 15.5, torch.arange(32) - 15.5, indexing="ij")
    interior = (yy**2 + xx**2).sqrt() < 14  # rotated, these still sample inside the image
    assert torch.allclose(y[:, :, interior], torch.tensor(0.7), atol=1e-6)
    assert (y[:, :, 0, 0] < 0.7 - 1e-3).any(), "some corner should pull in the zero fill"


def test_rotate_angles_spread_over_the_range():
    """Per-image angles: a marked pixel lands in different places across the batch."""
    x = torch.zeros(32, 1, 33, 33)
    x[:, :, 16, 30] = 1.0
    y = random_rotate(x, 90.0, gen(0))
    peaks = y.flatten(1).argmax(1)
    assert len(peaks.unique()) > 8
