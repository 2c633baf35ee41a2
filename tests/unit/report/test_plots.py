"""The report's PNGs (report/plots.py): full labels, no crowded panel, text never mathtext, a plot whole or absent."""

import pytest

from ddplab.report.build import build_report

from support.reports import write_axis_sweep


@pytest.mark.slow(why="draws every plot, with matplotlib")
def test_plots_name_every_point_in_full_and_never_crowd_a_panel(tmp_path):
    long = "batchnorm + dropout 0.5 in the head, with weight decay 5e-4 and label smoothing 0.1"
    variants = [
        (long if i == 0 else f"variant {i}", {"optim": {"lr": 0.001 * (i + 1)}}, {"test_acc": 0.6 + i / 100})
        for i in range(6)
    ]
    few = build_report([write_axis_sweep(tmp_path / "few", "config", variants[:3])], tmp_path / "few-out")
    (curves,) = [p for p in few["sections"][0]["plots"] if p.name == "curves"]
    assert curves.legend == [long, "variant 1", "variant 2"] and curves.max_lines == 6  # 3 points x train, test
    many = build_report([write_axis_sweep(tmp_path / "many", "config", variants)], tmp_path / "many-out")
    for plot in many["sections"][0]["plots"]:
        assert plot.max_lines <= 8 and all("…" not in entry for entry in plot.legend)
    for plot in few["sections"][0]["plots"] + many["sections"][0]["plots"]:
        assert not plot.clipped, (plot.name, plot.clipped)  # every legend inside its figure
    (curves,) = [p for p in many["sections"][0]["plots"] if p.name == "curves"]
    assert curves.max_lines == 2  # six points: one panel each


def test_labels_are_text_not_mathtext(tmp_path):
    sweep = write_axis_sweep(
        tmp_path / "s", "config", [("cost $\\notacommand$", {}, {}), ("b", {"optim": {"lr": 0.1}}, {})]
    )
    assert build_report([sweep], tmp_path / "out")["index_html"].is_file()


def test_a_plot_is_whole_or_absent(tmp_path, monkeypatch):
    """A full disk while a PNG is written: one FileSystemError naming it, nothing under its name, no temp file."""
    import errno

    import matplotlib.pyplot as plt

    from ddplab.errors import FileSystemError
    from ddplab.report import plots

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    real = type(fig).savefig

    def full_disk(self, path, **kwargs):
        real(self, path, **kwargs)  # the bytes land, then the disk fills (as a close that fails would)
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(type(fig), "savefig", full_disk)
    with pytest.raises(FileSystemError, match="No space left on device"):
        plots.save(fig, tmp_path / "loss.png", "a curve")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    fig, ax = plt.subplots()
    plot = plots.save(fig, tmp_path / "loss.png", "a curve")
    assert plot.path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and list(tmp_path.iterdir()) == [tmp_path / "loss.png"]


def test_the_curves_mark_where_a_runs_workers_changed(tmp_path):
    """metrics.jsonl's workers 3, 2, 2, 3: a line between epochs 1 and 2 and another between 3 and 4, each labelled,
    and the caption says what the line is; a run that kept its workers gets neither."""
    from ddplab.report.figures import mean_curve
    from ddplab.report.plots import plot_curves, resizes
    from ddplab.rundir.epochs import EpochRecord

    def record(epoch, workers):
        return EpochRecord(epoch=epoch, step=epoch, lr=0.1, train_loss=1.0 / epoch, train_acc=0.5, test_loss=1.0,
                           test_acc=0.5, train_samples=256, test_samples=64, epoch_s=1.0, train_s=0.9, eval_s=0.1,
                           images_per_s=100.0, workers=workers)  # fmt: skip

    resized = mean_curve([[record(e, w) for e, w in enumerate((3, 2, 2, 3), 1)]])
    kept = mean_curve([[record(e, 3) for e in range(1, 5)]])
    assert resizes(resized) == [(1.5, "3 to 2 workers"), (3.5, "2 to 3 workers")] and resizes(kept) == []
    plot = plot_curves(["resized", "kept"], [resized, kept], None, tmp_path / "curves.png")
    assert plot is not None and "workers changed there" in plot.caption and (tmp_path / "curves.png").stat().st_size
    assert "workers changed" not in plot_curves(["kept"], [kept], None, tmp_path / "kept.png").caption
