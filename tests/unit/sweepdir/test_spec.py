"""Sweep files: expansion into validated runs, names, profiles, the bundled sweeps."""

import json

import pytest
import torch

from ddplab.errors import ConfigError, DataError
from ddplab.sweep import (
    LocalExecutor,
    SweepFolder,
    dry_run_rows,
    dry_run_text,
    load_sweep,
    run_name_for,
    unavailable_runs,
)
from ddplab.sweepdir.folder import Status

from support.runs import epoch_line
from support.settings import REPO

BUNDLED = sorted((REPO / "sweeps").glob("*.toml"))

SWEEP = """
[sweep]
name = "demo"
repeats = 2

[base.data]
dataset = "synthetic"

[base.train]
epochs = 1
seed = 7

[grid]
"train.batch_size" = [16, 32]

[[variants]]
label = "1 worker"
"dist.strategy" = "single"

[[variants]]
label = "2 workers"
"dist.strategy" = "ddp"
"dist.nproc" = 2
launch = "torchrun"

[profiles.small.base.train]
epochs = 3

[profiles.small.grid]
"train.batch_size" = [8]
"""


def write(tmp_path, text, name="s.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_grid_times_variants_times_repeats(tmp_path):
    sweep = load_sweep(write(tmp_path, SWEEP))
    assert sweep.name == "demo" and sweep.axes == ["train.batch_size", "variant"] and sweep.repeats == 2
    assert [r.name for r in sweep.runs] == [
        "batch-size-16_1-worker_s7",
        "batch-size-16_1-worker_s8",
        "batch-size-16_2-workers_s7",
        "batch-size-16_2-workers_s8",
        "batch-size-32_1-worker_s7",
        "batch-size-32_1-worker_s8",
        "batch-size-32_2-workers_s7",
        "batch-size-32_2-workers_s8",
    ]
    run = sweep.runs[2]
    assert run.point == {"train.batch_size": 16, "variant": "2 workers"} and run.seed == 7 and run.launch == "torchrun"
    assert run.config.train.batch_size == 16 and run.config.dist.nproc == 2 and run.config.train.seed == 7
    assert sweep.runs[3].config.train.seed == 8 and sweep.runs[0].launch == "ddplab"
    assert sweep.runs[0].config.data.dataset == "synthetic" and sweep.runs[0].config.train.epochs == 1


def test_a_profile_overrides_base_and_grid(tmp_path):
    sweep = load_sweep(write(tmp_path, SWEEP), profile="small")
    assert sweep.profile == "small" and len(sweep.runs) == 4
    assert {r.config.train.batch_size for r in sweep.runs} == {8} and {r.config.train.epochs for r in sweep.runs} == {3}


def test_several_variant_sets_are_crossed(tmp_path):
    text = """
[base.data]
dataset = "synthetic"
[[variants.optimizer]]
label = "adam"
"optim.name" = "adam"
[[variants.optimizer]]
"optim.name" = "sgd"
[[variants.precision]]
"train.precision" = "bf16"
"""
    sweep = load_sweep(write(tmp_path, text, "two-sets.toml"))
    assert sweep.name == "two-sets" and sweep.axes == ["optimizer", "precision"]
    assert [r.point for r in sweep.runs] == [
        {"optimizer": "adam", "precision": "train.precision=bf16"},
        {"optimizer": "optim.name=sgd", "precision": "train.precision=bf16"},
    ]
    assert [r.name for r in sweep.runs] == ["adam_train-precision-bf16", "optim-name-sgd_train-precision-bf16"]


@pytest.mark.parametrize(
    "text, needle",
    [
        ('[grid]\n"train.batch_size" = [0]', "sweep run batch-size-0 ({'train.batch_size': 0}): train.batch_size=0"),
        ('[grid]\n"train.batch_size" = []', "grid.train.batch_size must be a non-empty list"),
        ('[grid]\n"batch_size" = [1]', "sweep setting 'batch_size' is not valid: write section.field"),
        ('[grid]\n"train.batchsize" = [1]', "unknown setting train.batchsize"),
        ("[sweep]\nrepeats = 0", "sweep.repeats=0 is not valid"),
        ("[sweep]\nrepeat = 2", "unknown [sweep] setting(s) repeat"),
        ("[axes]\nx = 1", "unknown table(s) axes"),
        ('[[variants]]\nlabel = "x"\nlaunch = "mpirun"', "launch='mpirun'"),
        # Nothing runs other than what its name says (a setting has one source; the seed comes from repeats).
        ('[grid]\n"train.seed" = [1, 2, 3]', "grid.train.seed: the seed is set by [sweep] repeats"),
        (
            '[grid]\n"optim.lr" = [0.1, 0.3]\n[[variants]]\nlabel = "fast"\n"optim.lr" = 0.2',
            "optim.lr is set by two axes (optim.lr and variant)",
        ),
        ('[[variants.a]]\n"optim.lr" = 0.1\n[[variants.b]]\n"optim.lr" = 0.2', "optim.lr is set by two axes (a and b)"),
        ("[profiles.cpu.bse.train]\nepochs = 1", "[profiles.cpu]: unknown table(s) bse"),
        ("[base.output]\nresume = true", "[base.output] resume is not valid in a sweep"),
        ('[grid]\n"output.out" = ["a", "b"]', "sweep setting 'output.out' is not valid"),
        # Wrong types are one line, not a traceback.
        ("grid = 5", "[grid] must be a table, got 5"),
        ("base = 5", "[base] must be a table, got 5"),
        ("sweep = 5", "[sweep] must be a table, got 5"),
        ("profiles = 5", "[profiles] must be a table, got 5"),
        ("[base]\ntrain = 5", "[base.train] must be a table, got 5"),
        ('[base.train]\nseed = "zero"', "train.seed='zero' in [base.train] is not valid"),
        ("[variants]\nx = 5", "variants.x must be an array of tables"),
        ("variants = 5", "variants must be an array of tables ([[variants]] or [[variants.NAME]]), got 5"),
        ('[sweep]\norder = "random"', "sweep.order='random' is not valid: choose one of listed, interleaved"),
        ("[sweep]\nname = 5", "sweep.name=5 is not valid: expected text"),
        # Unbounded work is refused before any is done.
        (
            '[grid]\n"train.batch_size" = ['
            + ", ".join(map(str, range(1, 1001)))
            + ']\n"train.epochs" = ['
            + ", ".join(map(str, range(1, 1001)))
            + "]",
            "expands to 1,000,000 runs",
        ),
        # A point listed twice would be one run under two names.
        (
            '[grid]\n"train.batch_size" = [8, 16, 8]',
            "grid.train.batch_size lists 8 twice: the same point would run twice",
        ),
        (
            '[[variants]]\nlabel = "a"\n[[variants]]\nlabel = "a"\n"optim.lr" = 0.2',
            "variants.variant (labels) lists 'a' twice",
        ),
        # Sections name points that exist, or say why not.
        ('[[sections]]\ntitle = "x"\npoints = ["nope"]', "names point 'nope', which no run has"),
        ('[[sections]]\ntitle = "x"\nkind = "vibes"', "kind='vibes' is not valid"),
        ('[[sections]]\nquestion = "x"', "sections[0] needs a title"),
        ("sections = 5", "sections must be an array of tables"),
    ],
)
def test_bad_sweep_files_are_one_line(tmp_path, text, needle):
    with pytest.raises(ConfigError) as exc:
        load_sweep(write(tmp_path, text))
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_unknown_profile_names_the_ones_there_are(tmp_path):
    with pytest.raises(ConfigError, match="has no profile 'huge'; it has: small"):
        load_sweep(write(tmp_path, SWEEP), profile="huge")


def test_run_names_are_readable_and_unique(tmp_path):
    assert run_name_for({"optim.lr": 0.001, "variant": "BatchNorm + Dropout"}, 0, 1) == "lr-0p001_batchnorm-dropout"
    text = '[base.data]\ndataset = "synthetic"\n[[variants]]\nlabel = "a b"\n[[variants]]\nlabel = "a-b"\n'
    assert [r.name for r in load_sweep(write(tmp_path, text)).runs] == ["a-b", "a-b-2"]


@pytest.mark.parametrize("path", BUNDLED, ids=[p.stem for p in BUNDLED])
def test_bundled_sweeps_parse_in_both_profiles(path):
    gpu, cpu = load_sweep(path, profile="gpu"), load_sweep(path, profile="cpu")
    assert gpu.description and gpu.axes and len(gpu.runs) >= 2 and len(cpu.runs) >= 1
    assert all(r.config.data.dataset == "cifar10" for r in gpu.runs + cpu.runs)
    assert all(r.config.train.device == "cpu" and r.config.dist.backend != "nccl" for r in cpu.runs)
    # The GPU profile captures the step where it can (the report says where it could not); a CPU has no graphs.
    assert {r.config.train.cuda_graphs for r in gpu.runs} == {"auto"}
    assert {r.config.cuda_graphs_on("cpu")[0] for r in cpu.runs} == {False}
    trained = sum(r.config.train.epochs * r.config.data.subset for r in cpu.runs)
    assert 0 < trained <= 250_000  # images trained in all: sized for minutes on 2 cores
    if not torch.cuda.is_available():
        unavailable_runs(cpu)  # the CPU profile runs on this machine


def test_on_one_gpu_the_assignment_skips_exactly_the_points_that_need_two(monkeypatch):
    """As `ddplab assignment` found on an H100 (2026-11-26): 10 of its 20 runs train on one GPU; the DDP points
    and DataParallel's "dp x2" (which had run over the one GPU) are not measured there."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    sweep = load_sweep(REPO / "sweeps" / "assignment.toml", profile="gpu")
    skipped = {run.point["config"] for run in sweep.runs if run.name in unavailable_runs(sweep)}
    assert skipped == {"dp x2", "ddp x2", "ddp x2 gloo", "ddp x2 bf16", "ddp x2 fp16"}
    assert len(sweep.runs) - len(unavailable_runs(sweep)) == 10
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert unavailable_runs(sweep) == {}


def test_every_seed_experiment_has_a_bundled_sweep():
    names = {p.stem for p in BUNDLED}
    assert {
        "batch_workers",
        "strategies",
        "backends",
        "precision",
        "accumulation",
        "optimizers",
        "regularization",
        "launch_modes",
    } <= names
    gpu_axes = {p.stem: load_sweep(p, profile="gpu") for p in BUNDLED}
    assert {r.config.dist.strategy for r in gpu_axes["strategies"].runs} == {"single", "dp", "ddp"}
    assert {r.config.dist.backend for r in gpu_axes["backends"].runs} == {"nccl", "gloo"}
    assert {r.config.train.precision for r in gpu_axes["precision"].runs} == {"fp32", "bf16", "fp16"}
    assert {r.launch for r in gpu_axes["launch_modes"].runs} == {"ddplab", "torchrun"}
    assert {r.config.optim.name for r in gpu_axes["optimizers"].runs} == {"adam", "sgd", "rmsprop", "adamw"}


def test_dry_run_plan_says_what_would_happen(tmp_path):
    sweep = load_sweep(write(tmp_path, SWEEP), profile="small")
    out = tmp_path / "out"
    finished, unfinished = (out / "runs" / r.name for r in sweep.runs[:2])
    (unfinished / "checkpoints").mkdir(parents=True)
    (unfinished / "checkpoints" / "last.pt").write_bytes(b"x")
    finished.mkdir(parents=True)
    (finished / "summary.json").write_text("{}")
    for run, run_dir in zip(sweep.runs, (finished, unfinished), strict=False):
        (run_dir / "config.toml").write_text(run.config.to_toml())
    lines = dry_run_text(sweep, SweepFolder(out)).splitlines()
    assert lines[0] == f"sweep demo: 4 runs in {out} (profile small)"
    assert (
        "skip (finished)" in lines[1]
        and "resume" in lines[2]
        and " run " in lines[3]
        and lines[3].endswith("[torchrun]")
    )
    assert len(lines) == 5
    # The same folder with other settings: the dry run says what the sweep would refuse, and why.
    other = dry_run_text(
        load_sweep(write(tmp_path, SWEEP), profile="small", overrides=["train.epochs=5"]), SweepFolder(out)
    ).splitlines()
    assert "refuse (other settings)" in other[1] and "refuse (other settings)" in other[2]
    assert other[-1].startswith(f"the sweep would stop before running anything: {finished} was trained with other")
    # ... and the sweep itself stops there: before any run, with nothing written.
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(
        ConfigError,
        match=r"was trained with other settings than the sweep now asks for \(train\.epochs "
        r"differ\): the sweep file, its profile or --set changed since",
    ):
        LocalExecutor().submit(
            load_sweep(write(tmp_path, SWEEP), profile="small", overrides=["train.epochs=5"]), SweepFolder(out)
        )
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_where_a_runs_nodes_met_never_makes_its_folder_stale(tmp_path):
    """An executor that starts each node's part (Ray) picks the rendezvous for each attempt and the run folder records
    it: a finished or unfinished point whose folder says where its nodes met is kept; any other setting is not."""
    import dataclasses

    sweep = load_sweep(write(tmp_path, SWEEP), profile="small")
    folder = SweepFolder(tmp_path / "out")
    for run, state in zip(sweep.runs[:2], ("finished", "unfinished"), strict=True):
        met = dataclasses.replace(run.config.dist, rdzv_endpoint="10.0.0.1:41234", rdzv_id="attempt-2", node_rank=0)
        run_dir = folder.run_dir(run.name)
        run_dir.mkdir(parents=True)
        (run_dir / "config.toml").write_text(dataclasses.replace(run.config, dist=met).to_toml())
        assert folder.stale_reason(run, state) is None
        lr = dataclasses.replace(run.config.optim, lr=run.config.optim.lr * 2)
        (run_dir / "config.toml").write_text(dataclasses.replace(run.config, dist=met, optim=lr).to_toml())
        assert "(optim.lr differ)" in (folder.stale_reason(run, state) or "")


def test_a_folder_trained_before_channels_last_became_auto_says_how_to_continue_it(tmp_path):
    """Its config.toml says false; on a CPU "auto" is another run (channels_last), so the point is refused, and the
    refusal names the default that changed and the setting that continues the folder; on CUDA it is the same run."""
    import dataclasses

    sweep = load_sweep(write(tmp_path, SWEEP), profile="small")
    folder = SweepFolder(tmp_path / "out")
    run = sweep.runs[0]
    assert run.config.model.channels_last == "auto"
    run_dir = folder.run_dir(run.name)
    run_dir.mkdir(parents=True)
    nchw = dataclasses.replace(run.config.model, channels_last=False)
    for device, refused in (("cpu", True), ("cuda", False)):
        on = dataclasses.replace(run.config, train=dataclasses.replace(run.config.train, device=device))
        (run_dir / "config.toml").write_text(dataclasses.replace(on, model=nchw).to_toml())
        why = folder.stale_reason(dataclasses.replace(run, config=on), "finished") or ""
        assert ("(model.channels_last differ)" in why and "which model.channels_last=false asks for" in why) is refused
        assert refused or why == ""


def test_settings_from_the_command_line_apply_to_every_run(tmp_path):
    """--set wins over the base; over a sweep's own axis it is refused (the names would lie)."""
    sweep = load_sweep(write(tmp_path, SWEEP), profile="small", overrides=["train.epochs=5", "optim.lr=0.01"])
    assert {r.config.train.epochs for r in sweep.runs} == {5} and {r.config.optim.lr for r in sweep.runs} == {0.01}
    assert [r.name for r in sweep.runs][:2] == ["batch-size-8_1-worker_s7", "batch-size-8_1-worker_s8"]
    with pytest.raises(ConfigError, match="--set dist.nproc would replace the sweep's own axis variant"):
        load_sweep(write(tmp_path, SWEEP), overrides=["dist.nproc=1"])
    with pytest.raises(ConfigError, match="--set train.batch_size would replace the sweep's own axis train.batch_size"):
        load_sweep(write(tmp_path, SWEEP), overrides=["train.batch_size=4"])
    with pytest.raises(ConfigError, match="train.epochs='many' is not valid"):
        load_sweep(write(tmp_path, SWEEP), overrides=["train.epochs=many"])
    with pytest.raises(ConfigError, match="write section.field=value"):
        load_sweep(write(tmp_path, SWEEP), overrides=["epochs=3"])


SECTIONED = """
[sweep]
name = "study"
repeats = 2
order = "interleaved"

[base.data]
dataset = "synthetic"

[[variants.config]]
label = "one"
[[variants.config]]
label = "two"
"dist.strategy" = "ddp"
"dist.nproc" = 2
[[variants.config]]
label = "bf16"
"train.precision" = "bf16"

[[sections]]
title = "Scaling"
kind = "scaling"
points = ["one", "two", "dp"]

[[sections]]
title = "Precision"
kind = "compare"
points = ["two", "bf16"]
baseline = "two"

[not_measured]
dp = "DataParallel needs two GPUs"
"""


def test_interleaved_order_turns_round_every_repeat(tmp_path):
    sweep = load_sweep(write(tmp_path, SECTIONED))
    assert [r.name for r in sweep.runs] == ["one_s0", "two_s0", "bf16_s0", "bf16_s1", "two_s1", "one_s1"]
    listed = load_sweep(write(tmp_path, SECTIONED.replace('order = "interleaved"', ""), "listed.toml"))
    assert [r.name for r in listed.runs] == ["one_s0", "one_s1", "two_s0", "two_s1", "bf16_s0", "bf16_s1"]


def test_sections_resolve_to_runs_and_say_what_is_not_measured(tmp_path):
    sweep = load_sweep(write(tmp_path, SECTIONED))
    scaling, precision = sweep.section_records()
    assert scaling["kind"] == "scaling" and scaling["runs"] == ["one_s0", "one_s1", "two_s0", "two_s1"]
    assert scaling["baseline_runs"] == ["one_s0", "one_s1"]
    assert scaling["not_measured"] == [{"point": "dp", "reason": "DataParallel needs two GPUs"}]
    assert precision["runs"] == ["two_s0", "two_s1", "bf16_s0", "bf16_s1"] and precision["baseline_runs"] == [
        "two_s0",
        "two_s1",
    ]
    # Without [[sections]]: one section over every run.
    (whole,) = load_sweep(write(tmp_path, SWEEP)).section_records()
    assert whole["title"] == "demo" and len(whole["runs"]) == 8 and whole["not_measured"] == []


def test_runs_this_machine_cannot_start_are_skipped_with_the_reason_or_refused(tmp_path):
    text = (
        '[sweep]\nunavailable = "skip"\n[base.data]\ndataset = "synthetic"\n[base.train]\ndevice = "cpu"\n'
        '[[variants]]\nlabel = "here"\n[[variants]]\nlabel = "there"\n"train.device" = "cuda:99"\n'
    )
    sweep = load_sweep(write(tmp_path, text))
    actions = {run.name: action for run, action, _ in dry_run_rows(sweep, SweepFolder(tmp_path / "out"))}
    assert actions == {"here": "run", "there": "skip (unavailable)"}
    # A skipped point is settled: once the others finish, nothing is left for a re-run (the sweep ends 0; it
    # ended 1 with "run the sweep again to retry them" on a 1-GPU machine, where a retry cannot help).
    manifest, todo = SweepFolder(tmp_path / "out").prepare(sweep, unavailable_runs(sweep), "local", echo=lambda _: None)
    assert [(e.name, e.status) for e in manifest.runs] == [("here", Status.PENDING), ("there", Status.SKIPPED)]
    assert [e.name for e in manifest.unfinished()] == ["here"] and [entry.name for _, entry in todo] == ["here"]
    manifest.runs[0].status = Status.FINISHED
    assert manifest.unfinished() == []
    with pytest.raises(ConfigError, match=r"sweep run there \(\{'variant': 'there'\}\) cannot run here: "):
        unavailable_runs(load_sweep(write(tmp_path, text.replace('"skip"', '"refuse"'))))


def test_a_running_run_shows_each_new_epoch_with_the_time_left(tmp_path):
    from ddplab.sweep.local import EpochWatch

    path = tmp_path / "metrics.jsonl"
    path.write_text(epoch_line(1, epoch_s=9.0))
    watch = EpochWatch(path, epochs=4)
    assert watch.new_lines() == []  # a resumed run's earlier epochs are not news
    third = epoch_line(3, epoch_s=5.0, test_acc=0.75)
    with path.open("a") as f:
        f.write(epoch_line(2, epoch_s=3.0, test_acc=0.625) + third[:20])
    # The mean epoch so far, times the epochs left; a line still being written is read next time.
    assert watch.new_lines() == ["epoch 2/4, test acc 62.50%, 3.0 s/epoch, about 6.0 s left"]
    with path.open("a") as f:
        f.write(third[20:])
    assert watch.new_lines() == ["epoch 3/4, test acc 75.00%, 5.0 s/epoch, about 4.0 s left"]
    assert watch.new_lines() == []


def test_the_sweep_measures_each_worker_count_once_and_keeps_what_it_has(tmp_path, monkeypatch):
    """A sweep with 2- and 4-worker points measures the all-reduce with 2 and with 4 ranks (on a CPU, 4 ranks
    on 2 cores as its runs are); a links file already there keeps its counts and gains the missing ones; a
    count that fails to measure costs only that count."""
    from ddplab.launch import allreduce
    from ddplab.planner import links
    from ddplab.sweep.local import measure_sweep_link

    measured = []

    def fake_measure(backend, ranks, *, device="cpu", max_bytes=0):
        measured.append(ranks)
        if ranks == 8:
            raise RuntimeError("eight ranks would not start")
        link = links.Link("x", 1.0, 0.001 * ranks, "test")
        sizes = list(links.SIZES[:5])
        return {
            "backend": backend,
            "ranks": ranks,
            "device": device,
            "sizes": sizes,
            "times_s": [link.allreduce_s(s, ranks) for s in sizes],
            "wall_s": 0.1,
        }

    monkeypatch.setattr(allreduce, "measure", fake_measure)
    text = SWEEP.replace('"dist.nproc" = 2', '"dist.nproc" = 4')
    said = []
    sweep = load_sweep(write(tmp_path, text))
    out = tmp_path / "out"
    out.mkdir()
    links.save_links(out / links.LINKS_FILE, [fake_measure("gloo", 2)])  # from an earlier sweep: 2 ranks only
    measured.clear()
    measure_sweep_link(sweep, SweepFolder(out), said.append)
    assert measured == [4] and links.load_links(out / links.LINKS_FILE).ranks == [2, 4]
    assert links.load_links(out / links.LINKS_FILE).for_ranks(4).alpha_s == pytest.approx(0.004)
    measure_sweep_link(sweep, SweepFolder(out), said.append)
    assert measured == [4]  # nothing missing: nothing measured
    eight = load_sweep(write(tmp_path, SWEEP.replace('"dist.nproc" = 2', '"dist.nproc" = 8'), "eight.toml"))
    measure_sweep_link(eight, SweepFolder(out), said.append)
    assert measured == [4, 8] and links.load_links(out / links.LINKS_FILE).ranks == [2, 4]
    assert (
        "x8: could not measure it (RuntimeError: eight ranks would not start); 8 workers are predicted over "
        "the nearest count measured" in said[-1]
    )


ADAPTED = (
    SECTIONED
    + """
[base.train]
epochs = 12

[adapt.cpu_without_native_bf16]
"bf16" = { "train.epochs" = 3 }
"""
)


@pytest.mark.parametrize("native", [False, True])
def test_an_adaptation_changes_the_points_it_names_only_where_its_condition_holds(tmp_path, monkeypatch, native):
    """[adapt.cpu_without_native_bf16] sizes the bf16 point down on a CPU without bf16 instructions, and
    only there; the manifest's sections and the dry run say what was detected and what changed."""
    from ddplab.metrics import system
    from ddplab.sweepdir import spec

    found = {"native": native, "text": "computes bf16 natively (AMX)" if native else "does not compute bf16 natively"}
    monkeypatch.setattr(system, "cpu_bf16", lambda: found)
    monkeypatch.setattr(system, "cpu_model", lambda: "Test CPU")
    sweep = load_sweep(write(tmp_path, ADAPTED))
    epochs = {r.name: r.config.train.epochs for r in sweep.runs}
    assert epochs == {
        "one_s0": 12,
        "two_s0": 12,
        "bf16_s0": 12 if native else 3,
        "bf16_s1": 12 if native else 3,
        "two_s1": 12,
        "one_s1": 12,
    }
    (adaptation,) = sweep.adaptations
    assert adaptation == spec.Adaptation(
        "cpu_without_native_bf16",
        not native,
        f"this CPU (Test CPU) {found['text']}",
        {"bf16": {"train.epochs": 3}},
        {"train.epochs": 12},
    )
    line = (
        "this CPU (Test CPU) computes bf16 natively (AMX): bf16 run as written"
        if native
        else "this CPU (Test CPU) does not compute bf16 natively: so bf16 with train.epochs=3 (the others: 12)"
    )
    scaling, precision = sweep.section_records()
    assert scaling["adapted"] == [] and precision["adapted"] == [line]
    assert scaling["adapted_points"] == [] and precision["adapted_points"] == ([] if native else ["bf16"])
    assert f"adapted to this machine: {line}" in dry_run_text(sweep, SweepFolder(tmp_path / "out"))


@pytest.mark.parametrize(
    ("table", "error"),
    [
        (
            '[adapt.cpu_without_native_bf16]\n"bf16" = { "train.precision" = "fp32" }',
            r"'bf16' sets train.precision, which an axis sets: an adaptation changes base settings only",
        ),
        ('[adapt.cpu_without_native_bf16]\n"bf16" = { "train.seed" = 3 }', r"which \[sweep\] repeats sets"),
        ('[adapt.cpu_without_native_bf16]\n"fp8" = { "train.epochs" = 3 }', r"names point\(s\) fp8, which no run has"),
        ('[adapt.cpu_without_native_bf16]\n"bf16" = 3', r"must be a table of settings"),
        (
            '[adapt.on_tuesdays]\n"bf16" = { "train.epochs" = 3 }',
            r"\[adapt.on_tuesdays\]: unknown condition; ddplab knows "
            r"cpu_without_native_bf16",
        ),
        ('[adapt.cpu_without_native_bf16]\n"bf16" = { "train.epochs" = 0 }', r"train.epochs"),
    ],
)
@pytest.mark.parametrize("native", [False, True])
def test_an_adaptation_that_would_break_a_promise_is_refused(tmp_path, monkeypatch, table, error, native):
    """On every machine, whether or not its condition holds there."""
    from ddplab.metrics import system

    monkeypatch.setattr(system, "cpu_bf16", lambda: {"native": native, "text": "?"})
    with pytest.raises(ConfigError, match=error):
        load_sweep(write(tmp_path, SECTIONED + table))


@pytest.mark.parametrize("native", [False, True])
def test_set_cannot_replace_what_an_adaptation_sets_where_it_holds(tmp_path, monkeypatch, native):
    """The manifest and the report would say the adaptation while the runs trained --set's value. Where its
    condition does not hold (a CPU with native bf16), the adaptation sets nothing: --set has the key alone."""
    from ddplab.metrics import system

    monkeypatch.setattr(system, "cpu_bf16", lambda: {"native": native, "text": "?"})
    if native:
        sweep = load_sweep(write(tmp_path, ADAPTED), overrides=["train.epochs=4"])
        assert {run.config.train.epochs for run in sweep.runs} == {4}
    else:
        with pytest.raises(
            ConfigError,
            match=r"--set train.epochs would replace what \[adapt.cpu_without_native_bf16\] "
            r"sets for bf16",
        ):
            load_sweep(write(tmp_path, ADAPTED), overrides=["train.epochs=4"])
    assert load_sweep(write(tmp_path, ADAPTED), overrides=["train.batch_size=8"]).runs[0].config.train.batch_size == 8


def test_a_label_longer_than_a_file_name_gives_a_short_distinct_folder(tmp_path):
    """Run folders, configs and logs are named after points: a 300-character label must not reach the file
    system as a 300-byte name (ENAMETOOLONG mid-sweep). Shortened deterministically: its start and a hash."""
    long = "x" * 300
    text = (
        f'[sweep]\nrepeats = 2\n[base.data]\ndataset = "synthetic"\n[[variants]]\nlabel = "{long}"\n'
        f'[[variants]]\nlabel = "{long}y"\n'
    )
    runs = load_sweep(write(tmp_path, text)).runs
    names = [r.name for r in runs]
    assert all(len(n) <= 120 for n in names) and len(set(names)) == 4
    assert [n[-3:] for n in names] == ["_s0", "_s1", "_s0", "_s1"] and names[0].startswith("x" * 100)
    assert names == [r.name for r in load_sweep(write(tmp_path, text, "again.toml")).runs]  # the same every time


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda m: m["runs"][0].update(status="done"), r"runs\[0\]\.status is 'done', not one of pending, running"),
        (
            lambda m: m["runs"][0].update(point={"train.lr": float("nan")}),
            r"runs\[0\]\.point\.train\.lr is nan, not text, a number",
        ),
        (
            lambda m: m["runs"][0].update(dir="../elsewhere"),
            r"runs\[0\]\.dir is '\.\./elsewhere', outside the sweep's runs/",
        ),
        (lambda m: m["runs"].append(dict(m["runs"][0])), r"runs\[1\]\.name 'a' is listed twice"),
        (lambda m: m.update(version=3), r"has version 3; this ddplab reads versions 1, 2"),
        (
            lambda m: m.update(sections=[{"title": "t", "runs": 5}]),
            r"sections\[0\]\.runs is 5, not a list, each item text",
        ),
        (lambda m: m["runs"][0].update(wall_s=-1), r"runs\[0\]\.wall_s is -1, not a number >= 0"),
    ],
    ids=["status", "nan-axis-value", "outside", "twice", "newer", "section-runs", "negative-wall"],
)
def test_the_manifest_has_one_reader_and_a_runner_remakes_a_bad_one_saying_so(tmp_path, edit, says):
    from support.runs import write_manifest

    folder = SweepFolder(tmp_path)
    write_manifest(tmp_path, [{"name": "a", "point": {"train.lr": 0.1}, "seed": 0}])
    assert folder.load().runs[0].name == "a"
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    edit(manifest)
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=says):
        folder.load()
    said = []
    assert folder.earlier_entries(said.append) == {}
    assert len(said) == 1 and said[0].startswith("note: ") and said[0].endswith(": made again from the run folders")


def test_the_manifest_names_the_executor_that_prepared_the_folder_and_keeps_a_newer_writers_fields(tmp_path):
    """--status and --wait ask the executor the manifest names: the folder's preparation writes it (a Slurm
    re-submission that found nothing to submit left "local" there, and --status stopped reading the queue).
    Fields this ddplab does not know (a newer one wrote them) are written back as they were read."""
    sweep = load_sweep(write(tmp_path, SWEEP), profile="small")
    folder = SweepFolder(tmp_path / "out")
    manifest, todo = folder.prepare(sweep, {}, "slurm", echo=lambda line: None)
    assert manifest.executor == "slurm" and folder.load().executor == "slurm" and len(todo) == len(sweep.runs)
    data = json.loads(folder.manifest_path.read_text())
    data["queue_hint"] = {"cluster": "a"}
    data["runs"][0]["retries"] = 2
    folder.manifest_path.write_text(json.dumps(data))
    folder.write(folder.load())
    again = json.loads(folder.manifest_path.read_text())
    assert again["queue_hint"] == {"cluster": "a"} and again["runs"][0]["retries"] == 2
    assert again == data


def test_every_field_the_manifest_is_written_with_is_declared_with_its_kind(tmp_path):
    """manifest.json is declared once (sweepdir.folder's Entry, Manifest and SectionRecord, each field's type and kind):
    what a manifest is written with has no field the declarations lack, and passes their checks."""
    from ddplab.sweepdir.folder import ENTRY, SECTION, TOP, Manifest

    sweep = load_sweep(write(tmp_path, SECTIONED), profile=None)
    data = Manifest.of(sweep, {}, {}, {sweep.runs[0].name: "needs 2 GPUs"}, executor="slurm").to_json()
    assert set(data) <= set(TOP.schema) and data["sections"], data
    TOP.check(data, "manifest.json")
    for entry in data["runs"]:
        assert set(entry) <= set(ENTRY.schema), entry
        ENTRY.check(entry, "manifest.json")
    for section in data["sections"]:
        assert set(section) <= set(SECTION.schema), section
        SECTION.check(section, "manifest.json")
