"""Where each module of src/ddplab is tested: `test_<module>.py` somewhere under tests/, or an entry of WHERE.

docs/architecture.md says where a new test goes: tests/unit/test_<module>.py for what runs in one process,
tests/smoke/ for a command run as a user runs it, tests/distributed/ for several processes, tests/kernels/ for
the GPU kernels. A module tested elsewhere (through a command, or with the modules it works with) names that
place here, with a text the test file holds (the name it imports, or the test): a moved or renamed test that
no longer reaches the module fails this file, not silently the map.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "ddplab"

# module (under src/ddplab) -> (test file, a text that file holds, what of the module is tested there)
WHERE = {
    "__main__.py": ("tests/smoke/test_runs.py", "ddplab_cli", "`python -m ddplab`: every command test starts it"),
    "io/arguments.py": ("tests/unit/test_config.py", "endpoint_parts", "option kinds at their borders"),
    "cli/common.py": ("tests/smoke/test_error_contract.py", "abbreviated-flag", "usage errors, modes, unused options"),
    "cli/data.py": ("tests/smoke/test_runs.py", "data_commands", "ddplab data and ddplab models, for real"),
    "cli/plan.py": ("tests/unit/test_config.py", "refuse_unmeasurable", "plan's options checked before it runs"),
    "cli/train.py": ("tests/unit/test_config.py", "config_from_args", "flags, presets and files to a config"),
    "rundir/checkpoint.py": ("tests/unit/test_runplan.py", "train_state", "what a resume reads, checked"),
    "data/dataset.py": ("tests/unit/test_loader.py", "ddplab.data.dataset", "in-memory datasets"),
    "data/datasets.py": ("tests/unit/test_data_formats.py", "ddplab.data.datasets", "CIFAR, STL-10, folders"),
    "data/formats.py": ("tests/unit/test_data_formats.py", "ddplab.data.formats", "the files each format holds"),
    "data/options.py": ("tests/unit/test_config.py", '"dataset": "mnist"', "the data settings' choices"),
    "engine/data_init.py": ("tests/unit/test_speedrun.py", "ddplab.engine.data_init", "whitening from the data"),
    "metrics/early_stop.py": ("tests/unit/test_optim.py", "ddplab.metrics.early_stop", "the early-stop rule"),
    "engine/evaluate.py": ("tests/distributed/test_ddp.py", "ddplab.engine.evaluate", "eval equals the run's"),
    "engine/clocks.py": ("tests/unit/test_stragglers.py", "StepClocks", "each rank's step and join times"),
    "engine/comm.py": ("tests/distributed/test_ddp.py", "engine/comm.py", "DDP's timers and the probe, 2 ranks"),
    "engine/readings.py": ("tests/distributed/test_ddp.py", "engine/readings.py", "CPU and memory of each rank"),
    "engine/state.py": ("tests/unit/test_epochs.py", "ddplab.engine.state", "the loop's state, round trip"),
    "engine/warmup.py": ("tests/unit/test_trainer.py", "warm_up_shapes", "every shape before the clocks"),
    "engine/graphed.py": ("tests/unit/test_graphed_step.py", "static_step", "the captured step"),
    "engine/lookahead.py": ("tests/unit/test_speedrun.py", "ddplab.engine.lookahead", "the speedrun's EMA"),
    "engine/muon.py": ("tests/unit/test_speedrun.py", "ddplab.engine.muon", "Muon"),
    "engine/probe.py": ("tests/smoke/test_sweep_runs.py", "each point probed", "the probe a sweep's estimate starts"),
    "engine/phases.py": ("tests/unit/test_trainer.py", "PhaseTimer", "where a step's time goes"),
    "engine/precision.py": ("tests/unit/test_speedrun.py", "ddplab.engine.precision", "autocast and scaler"),
    "engine/run.py": ("tests/unit/test_graphed_step.py", "ddplab.engine.run", "a run built and trained"),
    "engine/makedir.py": ("tests/unit/test_runplan.py", "was moved or removed", "the folder as a run starts"),
    "engine/tta.py": ("tests/unit/test_speedrun.py", "ddplab.engine.tta", "evaluation with TTA"),
    "errors.py": ("tests/smoke/test_error_contract.py", "Case(", "each error's line and exit code"),
    "kernels/_cuda.py": ("tests/kernels/test_rgb_to_gray.py", "from ddplab.kernels import", "the CUDA C++ kernel"),
    "kernels/_runtime.py": ("tests/kernels/test_rgb_to_gray.py", "from ddplab.kernels import", "backend choice"),
    "kernels/_triton.py": ("tests/kernels/test_conv_relu.py", "from ddplab.kernels import", "the Triton kernels"),
    "kernels/selftest.py": ("tests/smoke/test_gpu_check.py", "kernels check", "`ddplab kernels check`"),
    "launch/tracked.py": ("tests/smoke/test_mlflow.py", '"report/index.html"', "a run's report on its MLflow run"),
    "launch/elastic.py": ("tests/distributed/test_ddp.py", '"--nproc"', "the elastic launcher, for real"),
    "log.py": ("tests/distributed/test_ddp.py", "[rank \\d\\]", "each rank's log line (its time and rank)"),
    "metrics/gpu.py": ("tests/unit/test_gpu_sampling.py", "ddplab.metrics.gpu", "NVML sampling"),
    "metrics/meters.py": ("tests/distributed/test_ddp.py", "accuracy_equals", "device-side sums, all-reduced"),
    "metrics/mlflow_sink.py": ("tests/smoke/test_mlflow.py", "ddplab.metrics.mlflow_sink", "MLflow, for real"),
    "metrics/system.py": ("tests/distributed/test_network.py", "shaped_mbit", "env.json: the machine and its link"),
    "models/fastnet.py": ("tests/unit/test_speedrun.py", "ddplab.models.fastnet", "the speedrun's net"),
    "models/registry.py": ("tests/unit/test_models.py", "create_model", "the registry, counts"),
    "models/resnet.py": ("tests/unit/test_models.py", "resnet18", "every registered model"),
    "models/simple_cnn.py": ("tests/unit/test_models.py", "simple_cnn", "every registered model"),
    "models/vgg.py": ("tests/unit/test_models.py", "vgg_small", "every registered model"),
    "planner/command.py": ("tests/unit/test_plan_model.py", "plan.json", "what `ddplab plan` prints and writes"),
    "planner/model.py": ("tests/unit/test_plan_model.py", "from ddplab.planner import", "the scaling model"),
    "planner/published.py": ("tests/unit/test_band.py", "ddplab.planner.published", "published figures"),
    "report/build.py": ("tests/unit/test_report.py", "build_report", "a report from run folders"),
    "report/records.py": ("tests/unit/test_figures.py", "ddplab.report.records", "a run's and a point's rows"),
    "report/tables.py": ("tests/unit/test_headline.py", "ddplab.report.tables", "how figures are said"),
    "rundir/runfolder.py": (
        "tests/unit/test_config.py",
        "ddplab.rundir.runfolder",
        "what a run folder may be used for",
    ),
    "seeding.py": ("tests/unit/test_loader.py", "augment_seed", "per (seed, epoch, rank) streams"),
    "sweep/executor.py": ("tests/unit/test_slurm_submit.py", "ddplab.sweep.executor", "the executor protocol"),
    "sweepdir/folder.py": ("tests/unit/test_sweep.py", "ddplab.sweepdir.folder", "the manifest"),
    "sweep/local.py": ("tests/smoke/test_sweep_runs.py", "start_sweep", "local sweeps, for real"),
    "sweep/point.py": ("tests/smoke/test_sweep_runs.py", "resuming", "one point as every executor runs it"),
    "sweep/run.py": ("tests/smoke/test_sweep_runs.py", "run_sweep", "a sweep from Python, as the command runs it"),
    "sweepdir/spec.py": ("tests/unit/test_sweep.py", "load_sweep", "sweep files"),
    "sweep/trackers.py": ("tests/smoke/test_sweep_runs.py", "TRACKERS", "a sweep tracker told its start and end"),
    "topology.py": ("tests/unit/test_config.py", "TORCHRUN", "which launcher started this process"),
    "launch/warm/client.py": ("tests/unit/test_warm.py", "warm.Factory", "a client's servers and warm children"),
    "launch/warm/server.py": ("tests/unit/test_warm.py", "test_a_server_that_dies", "the fork server"),
    "launch/warm/fresh.py": ("tests/unit/test_warm.py", "FINGERPRINT", "a fork made what exec would make"),
    "launch/warm/spawn.py": ("tests/unit/test_warm.py", "ddp-2-workers", "DDP workers forked warm"),
    "launch/warm/protocol.py": ("tests/unit/test_environment.py", "DDPLAB_WARM", "the switch, what both sides share"),
}


def modules() -> list[str]:
    return sorted(
        str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if p.name != "__init__.py" and "__pycache__" not in p.parts
    )


def test_every_module_has_its_test_file_or_says_where_it_is_tested():
    own = {p.stem for p in (REPO / "tests").rglob("test_*.py")}
    untested = [m for m in modules() if f"test_{Path(m).stem}" not in own and m not in WHERE]
    assert untested == [], f"give each a tests/.../test_<name>.py, or an entry in WHERE: {untested}"
    stale = [m for m in WHERE if m not in modules() or f"test_{Path(m).stem}" in own]
    assert stale == [], f"WHERE names modules that are gone or have their own test file now: {stale}"


def test_each_entry_names_a_test_file_that_still_reaches_its_module():
    for module, (test_file, text, _) in WHERE.items():
        path = REPO / test_file
        assert path.is_file(), f"{module}: {test_file} does not exist"
        assert text in path.read_text(), f"{module}: {test_file} no longer holds {text!r}"
