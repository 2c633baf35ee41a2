"""A sweep's time said before its first run (sweep/estimate.py): priced by a probe or by finished runs,
kept honest as runs finish."""

import pytest

from ddplab.sweep import load_sweep
from ddplab.sweep.estimate import Estimate, PointCost, point_key, price

from support.sweeps import tiny_sweep


@pytest.fixture
def sweep(tmp_path):
    return load_sweep(tiny_sweep(tmp_path / "tiny.toml", epochs=4))


def test_runs_of_one_point_share_a_price_and_the_seed_is_not_part_of_it(tmp_path):
    text = tmp_path / "t.toml"
    path = tiny_sweep(text)
    path.write_text(path.read_text().replace('name = "tiny"', 'name = "tiny"\nrepeats = 2'))
    runs = load_sweep(path).runs
    keys = [point_key(r) for r in runs]
    assert keys[0] == keys[1] and len(set(keys)) == 3  # a_s0 == a_s1; a, b, ddp apart


def test_a_probe_prices_a_run_as_its_start_and_its_epochs(sweep):
    """Start: a Python with all a run imports, the data and its end (a DDP point's launcher first imports
    torch); an epoch: the
    steps (each worker takes its share of the images) with DDP's all-reduce, and the evaluation, split over
    the workers."""
    a, b, ddp = sweep.runs  # batch 16, 32, and 16 per worker on 2 workers
    point = {"step_s": 0.01, "eval_image_s": 0.001, "grad_bytes": 1000, "train_images": 256, "eval_images": 64}

    class Link:
        def for_ranks(self, n):
            assert n == 2
            return self

        def allreduce_s(self, size, n):
            assert (size, n) == (1000, 2)
            return 0.002

    probed = {"torch_s": 1.5, "import_s": 2.0, "data_s": 0.5, "exit_s": 0.25, "points": [point] * 3}
    costs = price([a, b, ddp], probed, Link())
    # a: 16 steps of 16 images; b: 8 of 32; ddp: 8 of 2 x 16, each with 4 link times (a CPU's
    # CPU_DDP_STEP_IN_LINK_TIMES), half the evaluation per worker, and the launcher's own start and end.
    expected = [
        (2.75, 16 * 0.01 + 64 * 0.001),
        (2.75, 8 * 0.01 + 64 * 0.001),
        (4.5, 8 * (0.01 + 4 * 0.002) + 32 * 0.001),
    ]
    assert [(c.start_s, c.epoch_s, c.source) for c in costs] == [
        (pytest.approx(start), pytest.approx(epoch), "probe") for start, epoch in expected
    ]
    assert price([ddp], {**probed, "points": [point]})[0].epoch_s == pytest.approx(8 * 0.01 + 0.032)


def test_finished_runs_replace_their_probe_and_scale_the_points_not_yet_run(sweep):
    a, b, ddp = sweep.runs
    keys = [point_key(r) for r in sweep.runs]
    estimate = Estimate(
        {
            keys[0]: PointCost(2.0, 2.0, "probe"),
            keys[1]: PointCost(2.0, 1.0, "probe"),
            keys[2]: PointCost(4.0, 10.0, "finished runs"),
        },
        {a.name: (keys[0], 4), b.name: (keys[1], 4), ddp.name: (keys[2], 1)},
    )
    names = [a.name, b.name, ddp.name]
    assert [estimate.run_s(n) for n in names] == [10.0, 6.0, 14.0]
    assert estimate.total_s(names) == 30.0 and estimate.total_s(names, at_once=2) == 15.0
    estimate.finished(a.name, 15.0)  # 1.5x its probe
    assert [estimate.run_s(n) for n in names] == [15.0, 9.0, 14.0]  # a measured; b scaled; ddp priced by its runs
    estimate.finished(ddp.name, 20.0)  # not a probe: scales nothing
    assert estimate.scale() == 1.5 and estimate.run_s(ddp.name) == 20.0


def test_a_probe_that_cannot_run_costs_the_estimate_only(sweep, monkeypatch):
    """Said in one line; the sweep goes on, and its finished runs give the estimate."""
    from ddplab.sweep import estimate

    def fails(configs):
        raise estimate.ProbeFailed("the probe failed: DataError: no images under /nowhere")

    monkeypatch.setattr(estimate, "run_probe", fails)
    said = []
    assert estimate.estimate(sweep, sweep.runs, {}, {}, echo=said.append) is None
    assert said == [
        "sweep tiny: no time estimate before the first run (the probe failed: DataError: no images under "
        "/nowhere); each finished run gives one"
    ]


def test_finished_runs_of_a_point_price_it_without_a_probe(sweep, monkeypatch):
    """A sweep run again: points whose runs finished before are priced by their wall time, and only the
    others are probed; a resumed run is priced for the epochs it has left."""
    from ddplab.sweep import estimate

    a, b, ddp = sweep.runs
    probed = []

    def probe(configs):
        probed.extend(configs)
        return {
            "torch_s": 1.0,
            "import_s": 2.0,
            "data_s": 0.0,
            "exit_s": 0.0,
            "wall_s": 3.0,
            "points": [{"step_s": 0.01, "eval_image_s": 0.0, "grad_bytes": 4, "train_images": 256, "eval_images": 0}],
        }

    monkeypatch.setattr(estimate, "run_probe", probe)
    found = estimate.estimate(sweep, [a, b], {b.name: 3}, {a.name: (8.0, 4), ddp.name: (20.0, 1)})
    assert probed == [b.config]
    assert found.run_s(a.name) == 8.0  # 4 epochs of 2 s, as its finished run took (its last process trained 4)
    assert found.run_s(b.name) == pytest.approx(2.0 + 1 * 8 * 0.01)  # 1 epoch left of 8 steps of 32 images
    assert "points with finished runs priced by them" in found.describe([a, b])


@pytest.mark.parametrize(("setting", "channels_last"), [("auto", True), (False, False)])
def test_the_probe_times_a_point_in_the_memory_format_its_run_trains_in(monkeypatch, setting, channels_last):
    """A CPU run trains channels_last under model.channels_last=auto (it trains 1.2-1.9x and evaluates 1.4-3.6x
    faster than NCHW there): a probe timing NCHW would price it as slow as it was."""
    import torch

    from ddplab.engine import probe, worker
    from ddplab.models import create_model

    from support.settings import tiny_config

    seen = []

    class Spy(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, x):
            weight = next(p for p in self.net.parameters() if p.dim() == 4)
            seen.append((x.is_contiguous(memory_format=torch.channels_last), weight.is_contiguous()))
            return self.net(x)

    monkeypatch.setattr(
        worker, "build_model", lambda config, data: Spy(create_model("simple_cnn", num_classes=4, image_size=16))
    )
    config = tiny_config(model={"channels_last": setting})
    data = type("Data", (), {"image_shape": (3, 16, 16), "num_classes": 4})()
    cost = probe.probe_point(config, data)
    assert cost["step_s"] > 0 and cost["eval_image_s"] > 0
    assert seen and set(seen) == {(channels_last, not channels_last)}
