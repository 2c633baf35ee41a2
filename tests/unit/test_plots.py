"""The report's PNGs (report/plots.py): full labels, no crowded panel, text never mathtext, a plot whole or absent."""

import pytest

from ddplab.report.build import build_report

from report_folders import write_axis_sweep


@pytest.mark.slow
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
