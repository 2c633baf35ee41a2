"""A sweep's runs in TensorBoard's HParams view (sweep/hparams.py), read back with TensorBoard's own readers."""

from pathlib import Path

import pytest

from ddplab.sweep import hparams
from ddplab.sweepdir.folder import SweepFolder

from support.runs import write_manifest, write_run

pytest.importorskip("tensorboard")


def read_sessions(root: Path) -> dict[str, dict]:
    """Each session folder's hyperparameters and metrics, as TensorBoard's HParams plugin data holds them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    out = {}
    for session in sorted(p for p in root.iterdir() if p.is_dir()):
        events = EventAccumulator(str(session), size_guidance={"tensors": 0, "scalars": 0})
        events.Reload()
        content = events.PluginTagToContent(metadata.PLUGIN_NAME)
        start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
        experiment = metadata.parse_experiment_plugin_data(content[metadata.EXPERIMENT_TAG])
        out[session.name] = {
            "hparams": {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind")) for k, v in start.hparams.items()},
            "metrics": {tag: events.Scalars(tag)[-1].value for tag in events.Tags()["scalars"]},
            "metric_tags": [m.name.tag for m in experiment.metric_infos],
            "domain": {h.name: [x.string_value for x in h.domain_discrete.values] for h in experiment.hparam_infos},
        }
    return out


def test_each_finished_run_is_a_session_with_its_axes_seed_and_results(tmp_path):
    """Two points of a text axis and a number axis, two seeds of one; a failed run and an axis mixing text and
    numbers: the failed run is left out, the mixed axis is shown as text."""
    sweep = tmp_path / "sweep"
    runs = []
    for name, precision, batch, compiled, seed, acc in (
        ("a", "fp32", 32, True, 0, 0.70),
        ("b", "fp32", 32, True, 1, 0.72),
        ("c", "bf16", "auto", False, 0, 0.69),
    ):
        write_run(sweep / "runs" / name, seed=seed, test_acc=acc)
        runs.append(
            {"name": name, "point": {"precision": precision, "batch": batch, "compile": compiled}, "seed": seed}
        )
    runs.append(
        {"name": "d", "point": {"precision": "fp16", "batch": 64, "compile": True}, "seed": 0, "status": "failed"}
    )
    write_manifest(sweep, runs, axes=("precision", "batch", "compile"))
    folder = SweepFolder(sweep)
    out = hparams.write(folder, folder.load())
    assert out == sweep / "tensorboard"
    sessions = read_sessions(out)
    assert set(sessions) == {"a", "b", "c"}  # the failed run "d" is not a session
    a = sessions["a"]
    # batch mixes 32 and "auto": text; a boolean axis is text too (torch's writer would make True the number 1)
    assert a["hparams"] == {"precision": "fp32", "batch": "32", "compile": "True", "seed": 0.0}
    assert sessions["c"]["hparams"]["batch"] == "auto" and sessions["b"]["hparams"]["seed"] == 1.0
    assert a["metrics"]["hparams/final_test_acc"] == pytest.approx(0.70)
    assert sessions["b"]["metrics"]["hparams/final_test_acc"] == pytest.approx(0.72)
    assert a["metrics"]["hparams/images_per_s"] == pytest.approx(1000 / 9)  # the fixture: 9 s epochs after the first
    assert set(a["metrics"]) == set(hparams.METRICS) == set(a["metric_tags"])
    assert a["domain"]["precision"] == ["fp32", "bf16"] and a["domain"]["batch"] == ["32", "auto"]
    assert a["domain"]["compile"] == ["True", "False"] and sessions["c"]["hparams"]["compile"] == "False"
    # Written again (a re-run of the sweep command): the same sessions, none doubled.
    hparams.write(folder, folder.load())
    assert read_sessions(out) == sessions and len(list((out / "a").iterdir())) == 1


def test_nothing_finished_writes_nothing(tmp_path):
    sweep = tmp_path / "sweep"
    (sweep / "runs").mkdir(parents=True)
    write_manifest(sweep, [{"name": "x", "point": {"config": "a"}, "seed": 0, "status": "failed"}])
    folder = SweepFolder(sweep)
    assert hparams.write(folder, folder.load()) is None and not (sweep / "tensorboard").exists()
