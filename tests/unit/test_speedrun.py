"""The speedrun preset's pieces: whitening init, Muon, lookahead, alternating flip, TTA, the preset itself."""

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F

from ddplab.data.augment import AugmentSpec
from ddplab.data.dataset import ImageDataset
from ddplab.data.loader import DeviceLoader
from ddplab.distributed import DistContext
from ddplab.engine.data_init import init_whitening
from ddplab.engine.lookahead import Lookahead
from ddplab.engine.muon import Muon, orthogonalize, split_params
from ddplab.engine.precision import Precision
from ddplab.engine.tta import evaluate, tta_views
from ddplab.engine.worker import build_trainer
from ddplab.errors import ConfigError
from ddplab.models import create_model

from support.settings import tiny_config

SPEEDNET = {"name": "speednet", "width": 0.125}


def images(n=400, size=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, 256, (n, 3, size, size), generator=g)
    # Correlated channels and neighbouring pixels, as in photos: whitening has something to undo.
    smooth = (base + base.roll(1, dims=3) + base.roll(1, dims=2)) / 3
    mixed = torch.stack([smooth[:, 0], 0.7 * smooth[:, 0] + 0.3 * smooth[:, 1], smooth[:, 2]], dim=1)
    return ImageDataset(
        images=mixed.round().to(torch.uint8), labels=torch.randint(0, 4, (n,), generator=g), classes=list("abcd")
    )


def test_whitening_stem_outputs_unit_variance_uncorrelated_patches():
    data = images()
    model = create_model("speednet", num_classes=4, width=0.125)
    init_whitening(model.whitening, data)
    x = (data.images.float() / 255 - torch.tensor(data.mean).view(1, 3, 1, 1)) / torch.tensor(data.std).view(1, 3, 1, 1)
    with torch.no_grad():
        out = model.whitening(x)  # [N, 24, H-1, W-1]
    channels = out.transpose(0, 1).reshape(24, -1).double()
    first, second = channels[:12], channels[12:]
    torch.testing.assert_close(second, -first)  # each direction and its negative
    assert first.mean(dim=1).abs().max() < 1e-4  # the bias removes the patch mean
    cov = torch.cov(first)
    # Unit variance up to eps / (lambda + eps), uncorrelated: the identity.
    torch.testing.assert_close(cov, torch.eye(12, dtype=torch.float64), atol=0.02, rtol=0)
    assert not model.whitening.weight.requires_grad and model.whitening.bias.requires_grad


def test_a_speednet_run_initializes_its_stem_from_the_data_and_times_it(tmp_path, tiny_run):
    import ddplab

    result = ddplab.train(tiny_config(tmp_path / "r", model=SPEEDNET, train={"epochs": 1}))
    assert result.summary["time"]["data_init_s"] > 0
    history = result.history
    assert result.summary["time"]["record_s"] == pytest.approx(
        result.summary["time"]["data_init_s"] + history[0].train_s + history[0].eval_s, abs=2e-3
    )
    plain = tiny_run(train={"epochs": 1})
    assert plain.summary["time"]["data_init_s"] is None


def test_muon_update_on_matrices_is_torch_muons():
    if not hasattr(torch.optim, "Muon"):
        pytest.skip(f"torch {torch.__version__} has no torch.optim.Muon")
    torch.manual_seed(0)
    w = torch.randn(48, 80)
    ours_w, ref_w = w.clone().requires_grad_(), w.clone().requires_grad_()
    ours = Muon([{"params": [ours_w], "orthogonalize": True}], lr=0.02, other_lr=1.0, momentum=0.95, weight_decay=0.01)
    ref = torch.optim.Muon([ref_w], lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.01, adjust_lr_fn="original")
    for _ in range(4):
        g = torch.randn(48, 80)
        before_ours, before_ref = ours_w.detach().clone(), ref_w.detach().clone()
        ours_w.grad, ref_w.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
        d_ours, d_ref = (ours_w - before_ours).detach().flatten(), (ref_w - before_ref).detach().flatten()
        # Both orthogonalize in bfloat16, with the operations in another order: the same step to bf16 precision.
        assert F.cosine_similarity(d_ours, d_ref, dim=0) > 0.998
        assert d_ours.norm() / d_ref.norm() == pytest.approx(1.0, abs=0.02)


def test_muon_steps_the_other_parameters_like_nesterov_sgd_with_l2():
    torch.manual_seed(0)
    start = [torch.randn(10, 16), torch.randn(16)]
    ours_p = [w.clone().requires_grad_() for w in start]
    ref_p = [w.clone().requires_grad_() for w in start]
    ours = Muon(
        [{"params": ours_p, "orthogonalize": False}],
        lr=0.02,
        other_lr=0.3,
        momentum=0.6,
        other_momentum=0.85,
        weight_decay=1e-2,
    )
    ref = torch.optim.SGD(ref_p, lr=0.3, momentum=0.85, nesterov=True, weight_decay=1e-2, foreach=False)
    for _ in range(5):
        grads = [torch.randn_like(w) for w in start]
        for a, b, g in zip(ours_p, ref_p, grads, strict=True):
            a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    for a, b in zip(ours_p, ref_p, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_muon_settings_reach_the_filter_group_only():
    from ddplab.config import OptimConfig
    from ddplab.engine.optim import build_optimizer

    model = create_model("speednet", num_classes=10, width=0.125)
    init_whitening(model.whitening, images())  # the stem's filters, frozen since construction
    cfg = OptimConfig(
        name="muon", lr=3.0, muon_lr=0.2, momentum=0.85, muon_momentum=0.6, muon_ns_steps=3, muon_normalize=True
    )
    filters, others = build_optimizer(model.parameters(), cfg).param_groups
    assert (filters["orthogonalize"], filters["lr"], filters["momentum"]) == (True, 0.2, 0.6)
    assert (others["orthogonalize"], others["lr"], others["momentum"]) == (False, 3.0, 0.85)
    assert filters["ns_steps"] == 3 and filters["normalize"] is True
    # Frozen: the whitening filters and every norm's scale; trained: the shifts, the whitening bias, the head.
    assert not any(p is model.whitening.weight for p in filters["params"])
    assert len(others["params"]) == 1 + 6 + 1 and all(p.dim() == 1 or p is model.head.weight for p in others["params"])
    default = build_optimizer(model.parameters(), OptimConfig(name="muon", momentum=0.9)).param_groups
    assert [g["momentum"] for g in default] == [0.9, 0.9]


def test_normalized_muon_step_does_not_depend_on_the_filters_scale():
    torch.manual_seed(0)
    w, g = torch.randn(8, 4, 3, 3), torch.randn(8, 4, 3, 3)
    results = {}
    for normalize in (True, False):
        for scale in (1.0, 10.0):
            p = (w * scale).requires_grad_()
            opt = Muon(
                [{"params": [p], "orthogonalize": True}],
                lr=0.1,
                other_lr=1.0,
                momentum=0.6,
                weight_decay=0.01,
                normalize=normalize,
            )
            p.grad = g.clone()
            opt.step()
            results[normalize, scale] = p.detach()
    torch.testing.assert_close(results[True, 1.0], results[True, 10.0])
    assert not torch.allclose(results[False, 1.0], results[False, 10.0] / 10)  # a plain step is a fixed size
    # Before its step a normalized bank has norm sqrt(out channels): the step is a fixed fraction of it.
    step = results[True, 1.0] - w * (math.sqrt(8) / w.norm())
    assert step.norm() / math.sqrt(8) == pytest.approx(0.1, rel=0.5)


def test_speednet_norms_follow_recent_batches_and_train_only_their_shift():
    model = create_model("speednet", num_classes=10, width=0.125)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert len(norms) == 6
    assert all(
        n.momentum == 0.4 and n.eps == 1e-12 and not n.weight.requires_grad and n.bias.requires_grad for n in norms
    )
    assert model.groups[0].pool.ceil_mode is False


def test_speednet_head_under_one_rate_steps_like_the_records_head_under_its_own():
    """SGD at rate r on W' x * s moves the logits as SGD at rate r * HEAD_RATE_RATIO on W x / width does."""
    from ddplab.models.fastnet import HEAD_RATE_RATIO

    torch.manual_seed(0)
    model = create_model("speednet", num_classes=10, width=0.125)
    width = model.head.in_features
    head = model.head.weight.detach()
    assert (head * width * model.logit_scale).std() == pytest.approx(1.0, rel=1e-5)  # the record's W has unit std
    x, y = torch.randn(64, width), torch.randint(0, 10, (64,))
    ours = head.clone().requires_grad_()
    record = (head * width * model.logit_scale).requires_grad_()  # the same function
    rate = 5.0
    for w, logits, lr in (
        (ours, lambda: x @ ours.T * model.logit_scale, rate),
        (record, lambda: x @ record.T / width, rate * HEAD_RATE_RATIO),
    ):
        opt = torch.optim.SGD([w], lr=lr, momentum=0.85, nesterov=True)
        for _ in range(3):
            opt.zero_grad()
            F.cross_entropy(logits(), y).backward()
            opt.step()
    torch.testing.assert_close(x @ ours.T * model.logit_scale, x @ record.T / width, rtol=1e-4, atol=1e-5)


def test_speednet_refuses_images_its_poolings_would_empty():
    assert create_model("speednet", num_classes=10, width=0.125, image_size=9)(torch.randn(2, 3, 9, 9)).shape == (2, 10)
    with pytest.raises(ConfigError, match="at least 9x9 pixels"):
        create_model("speednet", num_classes=10, width=0.125, image_size=8)


def test_orthogonalize_flattens_the_spectrum_of_tall_and_wide_matrices():
    torch.manual_seed(0)
    for shape in [(32, 72), (72, 32)]:
        m = torch.randn(*shape) @ torch.diag(torch.logspace(-2, 1, shape[1]))  # singular values over decades
        before, after = torch.linalg.svdvals(m), torch.linalg.svdvals(orthogonalize(m).float())
        # Five Newton-Schulz steps pull every singular value towards 1 (a spread around it, not U V^T exactly).
        assert after.max() < 1.25 and after.max() / after.min() < (before.max() / before.min()) / 10


def test_muon_orthogonalizes_filters_only_and_trains():
    model = create_model("simple_cnn", num_classes=4, width=0.5)
    groups = split_params(model.parameters())
    assert [g["orthogonalize"] for g in groups] == [True, False]
    assert all(p.dim() == 4 for p in groups[0]["params"]) and all(p.dim() != 4 for p in groups[1]["params"])
    cfg = tiny_config(train={"epochs": 3}, optim={"name": "muon", "lr": 0.05, "muon_lr": 0.05})
    trainer = build_trainer(cfg, DistContext(), None)[0]
    assert [g["lr"] for g in trainer.optimizer.param_groups] != [None]
    state = trainer.fit()
    assert state.history[-1].test_acc >= 0.6  # 4 classes: chance is 0.25


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")
def test_onecycle_gives_each_muon_group_its_own_peak():
    cfg = tiny_config(train={"epochs": 1}, optim={"name": "muon", "lr": 0.1, "muon_lr": 0.02, "warmup_epochs": 0.5})
    trainer = build_trainer(cfg, DistContext(), None)[0]
    peaks = [0.0, 0.0]
    for _ in range(trainer.steps_per_epoch()):
        peaks = [max(p, g["lr"]) for p, g in zip(peaks, trainer.optimizer.param_groups, strict=True)]
        trainer.scheduler.step()
    assert peaks == pytest.approx([0.02, 0.1], rel=1e-6)


def test_lookahead_moves_slow_weights_part_way_and_restarts_the_fast_ones():
    w = torch.nn.Parameter(torch.zeros(3))
    la = Lookahead([w], every=2, alpha=0.25)
    with torch.no_grad():
        w.add_(4.0)
    la.after_step(1)  # not a multiple of 2: nothing
    assert w.tolist() == [4.0] * 3
    la.after_step(2)
    assert w.tolist() == [1.0] * 3 and la.slow[0].tolist() == [1.0] * 3  # 0 + 0.25 * (4 - 0)


@pytest.mark.slow(why="trains the speedrun recipe twice, interrupted and whole, to compare them bit for bit")
def test_an_interrupted_speedrun_style_run_resumes_bit_identically(tmp_path, monkeypatch):
    """Every piece at once (whitening, Muon, lookahead, alternating flip, TTA): nothing is lost at an epoch boundary."""
    import ddplab
    from ddplab.engine.trainer import Trainer

    cfg = dict(
        model=SPEEDNET,
        train={"epochs": 3, "tta": "flip_translate"},
        data={"flip_mode": "alternate"},
        optim={"name": "muon", "lr": 0.05, "muon_lr": 0.05, "lookahead_steps": 3},
    )
    whole = ddplab.train(tiny_config(tmp_path / "whole", **cfg))
    real_run_epoch = Trainer.run_epoch

    def crash_in_epoch_2(self, epoch):
        if epoch == 2:
            raise KeyboardInterrupt
        return real_run_epoch(self, epoch)

    monkeypatch.setattr(Trainer, "run_epoch", crash_in_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        ddplab.train(tiny_config(tmp_path / "cut", **cfg))
    monkeypatch.setattr(Trainer, "run_epoch", real_run_epoch)
    resumed = ddplab.train(
        tiny_config(tmp_path / "cut", output={"resume": True, "progress": False, "tensorboard": False}, **cfg)
    )
    keys = ("train_loss", "train_acc", "test_loss", "test_acc")
    assert [[r.metric(k) for k in keys] for r in resumed.history] == [
        [r.metric(k) for k in keys] for r in whole.history
    ]
    without = ddplab.train(tiny_config(tmp_path / "plain", **{**cfg, "optim": {**cfg["optim"], "lookahead_steps": 0}}))
    assert without.history[-1].test_loss != whole.history[-1].test_loss  # lookahead changed the run


def loader(flip_mode, *, rank=0, world_size=1):
    data = images(n=64)
    return DeviceLoader(
        data,
        batch_size=16,
        device="cpu",
        train=True,
        seed=3,
        rank=rank,
        world_size=world_size,
        augment=AugmentSpec(flip=True, flip_mode=flip_mode),
    )


def mirrored(ld, epoch):
    """Which dataset images this loader mirrors in `epoch`, from the batches themselves."""
    ld.set_epoch(epoch)
    index = ld.indices()
    raw = ld.images.float().div(255).sub(ld.mean).div(ld.std)
    seen = {}
    for i, (x, _) in enumerate(ld):
        for j, image in enumerate(x):
            k = int(index[i * 16 + j])
            seen[k] = torch.equal(image, raw[k].flip(2)) and not torch.equal(image, raw[k])
    return seen


def test_alternating_flip_mirrors_each_image_every_other_epoch():
    ld = loader("alternate")
    epochs = [mirrored(ld, e) for e in (1, 2, 3)]
    assert 16 <= sum(epochs[0].values()) <= 48  # about half in the first epoch
    assert all(epochs[1][k] == (not epochs[0][k]) for k in epochs[0])  # the other half in the next
    assert epochs[2] == epochs[0]
    random = loader("random")
    first, second = mirrored(random, 1), mirrored(random, 2)
    assert any(first[k] == second[k] for k in first)  # random flips do repeat


def test_alternating_flip_agrees_between_ranks():
    a, b = loader("alternate", rank=0, world_size=2), loader("alternate", rank=1, world_size=2)
    assert torch.equal(a.flip_parity, b.flip_parity)


def test_tta_averages_the_logits_of_its_views():
    x = torch.randn(2, 3, 8, 8)
    assert (
        len(tta_views(x, "none")) == 1 and len(tta_views(x, "flip")) == 2 and len(tta_views(x, "flip_translate")) == 6
    )
    shifted = tta_views(x, "flip_translate")[1]
    assert torch.equal(shifted[..., 1:, 1:], x[..., :-1, :-1])  # one pixel down and right
    torch.manual_seed(0)
    model = create_model("simple_cnn", num_classes=4, in_channels=3, image_size=8, width=0.5).eval()
    data = images(n=40, size=8)
    ld = DeviceLoader(data, batch_size=40, device="cpu", train=False)
    batch, y = next(iter(ld))
    with torch.no_grad():
        logits = (model(batch) + model(batch.flip(3))) / 2
    result = evaluate(model, ld, Precision("fp32", torch.device("cpu")), DistContext(), tta="flip")
    assert result["loss"] == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-5)
    assert result["correct"] == int((logits.argmax(1) == y).sum())
    # Six views: the unshifted pair weighs as much as the four shifted ones together.
    with torch.no_grad():
        out = [model(v) for v in tta_views(batch, "flip_translate")]
    logits = 0.25 * (out[0] + out[3]) + 0.125 * (out[1] + out[2] + out[4] + out[5])
    result = evaluate(model, ld, Precision("fp32", torch.device("cpu")), DistContext(), tta="flip_translate")
    assert result["loss"] == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-5)


@pytest.mark.slow(why="trains the speedrun preset end to end")
def test_speedrun_preset_is_a_valid_recipe_and_trains(tmp_path, monkeypatch):
    from ddplab.cli import build_parser, config_from_args

    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["train", "--preset", "speedrun", "--device", "cpu"])
    cfg = config_from_args(args)
    assert (cfg.model.name, cfg.optim.name, cfg.data.flip_mode, cfg.train.tta) == (
        "speednet",
        "muon",
        "alternate",
        "flip_translate",
    )
    assert cfg.train.cuda_graphs == "auto" and cfg.cuda_graphs_on("cuda") == (True, "auto: on")
    import subprocess
    import sys

    small = [
        "--dataset",
        "synthetic",
        "--data.synthetic_size",
        "256",
        "--data.image_size",
        "16",
        "--data.num_classes",
        "4",
        "--model.compile",
        "false",
        "--model.width",
        "0.125",
        "--epochs",
        "2",
        "--batch-size",
        "64",
        "--optim.lr",
        str(0.053 * 64),  # the preset's 106 is 0.053 per image of its batch of 2000
        "--train.eval_batch_size",
        "64",
        "--device",
        "cpu",
        "--output.progress",
        "false",
        "--output.tensorboard",
        "false",
        "--out",
        str(tmp_path / "run"),
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "ddplab", "train", "--preset", "speedrun", *small],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["run"]["optimizer"] == "muon" and summary["time"]["data_init_s"] > 0
    assert math.isfinite(summary["final"]["test_loss"]) and summary["final"]["test_acc"] > 0.4


def test_unknown_preset_and_two_bases_are_config_errors():
    from ddplab.cli import build_parser, config_from_args

    with pytest.raises(ConfigError, match="--preset 'fast' does not exist: presets are speedrun"):
        config_from_args(build_parser().parse_args(["train", "--preset", "fast"]))
    with pytest.raises(ConfigError, match="choose one"):
        config_from_args(build_parser().parse_args(["train", "--preset", "speedrun", "--config", "x.toml"]))


def test_speednet_weights_start_as_partial_identities():
    model = create_model("speednet", num_classes=10, width=0.25)
    conv = model.groups[1].conv2  # 64 -> 64
    n = conv.in_channels
    centre = conv.weight[:n, :n, 1, 1]
    assert torch.equal(centre, torch.eye(n)) and not conv.weight[:n, :n, 0, 0].any()


def test_filter_banks_of_one_shape_are_orthogonalized_together_as_one_at_a_time():
    """Batched Newton-Schulz: a stack of matrices gives each what it alone gives (bfloat16, so within its
    rounding), wide and tall alike; a Muon step over banks of shared shapes equals the per-bank loop."""
    from ddplab.engine.muon import Muon, orthogonalize

    torch.manual_seed(0)
    for shape in ((16, 27), (64, 32)):
        stack = torch.randn(5, *shape)
        together = orthogonalize(stack, 3).float()
        for i in range(5):
            torch.testing.assert_close(together[i], orthogonalize(stack[i], 3).float(), atol=2e-2, rtol=2e-2)
    banks = [torch.nn.Parameter(torch.randn(s)) for s in ((8, 3, 3, 3), (8, 3, 3, 3), (16, 8, 3, 3), (8, 3, 3, 3))]
    copies = [torch.nn.Parameter(b.detach().clone()) for b in banks]
    for b, c in zip(banks, copies, strict=True):
        b.grad = torch.randn_like(b)
        c.grad = b.grad.clone()
    Muon([{"params": banks, "orthogonalize": True}], lr=0.1, other_lr=0.1, ns_steps=3).step()
    for c in copies:  # the loop it replaced: one bank at a time
        rows, cols = c.shape[0], c[0].numel()
        update = c.grad.add(c.grad * 0.9, alpha=0.9)  # Nesterov on a fresh buffer: g + 0.9 g
        ortho = orthogonalize(update.reshape(rows, cols), 3).view_as(c).float() * max(1.0, rows / cols) ** 0.5
        c.data.sub_(ortho * 0.1)
    for b, c in zip(banks, copies, strict=True):
        torch.testing.assert_close(b.detach(), c.detach(), atol=5e-3, rtol=5e-3)


def filter_banks(seed: int = 0) -> list[torch.nn.Parameter]:
    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s)) for s in ((8, 3, 3, 3), (16, 8, 3, 3))]


def muon_steps(opt, banks, steps: int, before_each=None, gen=None) -> None:
    """`steps` Muon steps on gradients drawn from `gen` (a seed of their own: the same for every optimizer)."""
    gen = gen or torch.Generator().manual_seed(1)
    for i in range(steps):
        for b in banks:
            b.grad = torch.randn(b.shape, generator=gen)
        if before_each is not None:
            before_each(i)
        opt.step()


def test_filters_renormalized_every_few_steps_are_those_renormalized_on_exactly_those_steps():
    """muon_normalize_every=3 rescales on steps 1, 4, 7: the same weights, bit for bit, as rescaling each step
    with the rescale switched off on the others; its count survives a checkpoint."""
    from ddplab.engine.muon import Muon

    every = filter_banks()
    opt = Muon([{"params": every, "orthogonalize": True}], lr=0.1, other_lr=0.1, normalize=True, normalize_every=3)
    muon_steps(opt, every, 7)
    switched = filter_banks()
    ref = Muon([{"params": switched, "orthogonalize": True}], lr=0.1, other_lr=0.1, normalize=True)
    muon_steps(ref, switched, 7, lambda i: ref.param_groups[0].update(normalize=i % 3 == 0))
    assert all(torch.equal(a, b) for a, b in zip(every, switched, strict=True))
    never = filter_banks()
    muon_steps(Muon([{"params": never, "orthogonalize": True}], lr=0.1, other_lr=0.1), never, 7)
    assert not all(torch.equal(a, b) for a, b in zip(every, never, strict=True))  # the rescale did something
    # resumed after step 5 from a saved state: steps 6 and 7 as the straight run took them
    resumed, gen = filter_banks(), torch.Generator().manual_seed(1)
    first = Muon([{"params": resumed, "orthogonalize": True}], lr=0.1, other_lr=0.1, normalize=True, normalize_every=3)
    muon_steps(first, resumed, 5, gen=gen)
    again = Muon([{"params": resumed, "orthogonalize": True}], lr=0.1, other_lr=0.1, normalize=True, normalize_every=3)
    again.load_state_dict(copy.deepcopy(first.state_dict()))
    assert again.state[resumed[0]]["normalize_count"].dtype == torch.int64  # torch's load casts it to the weights'
    muon_steps(again, resumed, 2, gen=gen)
    assert all(torch.equal(a, b) for a, b in zip(every, resumed, strict=True))


def test_a_bf16_momentum_buffer_is_kept_in_bf16_through_a_checkpoint_and_steps_near_fp32s():
    from ddplab.engine.muon import Muon

    banks, head = filter_banks(), torch.nn.Parameter(torch.randn(10, 4))
    groups = [{"params": banks, "orthogonalize": True}, {"params": [head], "orthogonalize": False}]
    opt = Muon(groups, lr=0.1, other_lr=0.1, momentum_precision="bf16")
    head.grad = torch.randn_like(head)
    muon_steps(opt, banks, 3)
    assert {opt.state[b]["momentum_buffer"].dtype for b in banks} == {torch.bfloat16}
    assert opt.state[head]["momentum_buffer"].dtype == torch.float32  # the rest: plain momentum, as the weights
    again = Muon(groups, lr=0.1, other_lr=0.1, momentum_precision="bf16")
    again.load_state_dict(copy.deepcopy(opt.state_dict()))
    for b in banks:
        loaded = again.state[b]["momentum_buffer"]
        assert loaded.dtype == torch.bfloat16 and torch.equal(loaded, opt.state[b]["momentum_buffer"])
    full = filter_banks()
    muon_steps(Muon([{"params": full, "orthogonalize": True}], lr=0.1, other_lr=0.1), full, 3)
    for a, b in zip(banks, full, strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), atol=2e-2, rtol=2e-2)
    with pytest.raises(ValueError, match="momentum_precision"):
        Muon(groups, lr=0.1, other_lr=0.1, momentum_precision="fp8")


def test_the_muon_options_reach_the_optimizer_and_bad_values_are_config_errors():
    from ddplab.config import build_config
    from ddplab.engine.optim import build_optimizer

    optim = build_config({"optim": {"name": "muon", "muon_normalize": True, "muon_normalize_every": 4,
                                    "muon_momentum_precision": "bf16"}}).optim  # fmt: skip
    group = build_optimizer(filter_banks(), optim).param_groups[0]
    assert (group["normalize_every"], group["momentum_precision"]) == (4, "bf16")
    with pytest.raises(ConfigError, match=r"optim\.muon_normalize_every=0 is not valid: must be a whole number >= 1"):
        build_config({"optim": {"muon_normalize_every": 0}})
    with pytest.raises(ConfigError, match=r"optim\.muon_momentum_precision='fp16' is not valid: must be one of fp32"):
        build_config({"optim": {"muon_momentum_precision": "fp16"}})
