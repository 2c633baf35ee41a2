"""Where each module of src/ddplab is tested, by path: `ddplab/a/b.py`'s own tests are tests/unit/a/test_b.py
(tests/kernels/ for the kernels), a file that imports it, or an entry of WHERE.

docs/architecture.md says where a new test goes: tests/unit/ laid out like src/ddplab for what runs in one process,
tests/smoke/ for a command run as a user runs it, tests/distributed/ for several processes, tests/kernels/ for
the GPU kernels. A module tested elsewhere (through a command, or with the modules it works with) names that
place here: a test file that imports it (None), or the test in that file that reaches it. Both are read from
the file's syntax, not its text, so a comment never satisfies the map, and a moved or renamed test fails here.
"""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "ddplab"

IMPORTS = None  # the test file imports the module itself
SWEEP_RUNS = "tests/smoke/test_sweep_runs.py"
ERRORS = "tests/smoke/test_error_contract.py"
SPEEDRUN = "tests/unit/test_speedrun.py"
DDP = "tests/distributed/test_ddp.py"
WARM = "tests/unit/launch/test_warm.py"
REGISTRY = "tests/unit/models/test_registry.py"
PLAN = "tests/unit/planner/test_model.py"

# module (under src/ddplab) -> (test file, the test there that reaches it or IMPORTS, what of the module is tested)
# fmt: off
WHERE = {
    "__main__.py": ("tests/smoke/test_runs.py", "test_bad_config_is_one_line_and_exit_2", "`python -m ddplab`"),
    "cli/common.py": (ERRORS, "test_error_contract", "usage errors, modes, unused options"),
    "cli/data.py": ("tests/smoke/test_runs.py", "test_models_and_data_commands", "ddplab data and ddplab models"),
    "cli/hosts.py": ("tests/unit/launch/test_hosts.py", "test_sigterm_while_hosts_come_up_takes_down_what_was_made",
                     "ddplab hosts up, stopped half-way"),
    "cli/plan.py": ("tests/unit/test_config.py",
                    "test_port_0_for_two_nodes_is_refused_by_plan_measure_before_any_process",
                    "plan's options checked before it runs"),
    "cli/report.py": (SWEEP_RUNS, "test_a_sweep_survives_failures_and_a_rerun_resumes", "ddplab report, for real"),
    "cli/sweep.py": (SWEEP_RUNS, "test_dry_run_lists_the_runs_and_runs_nothing", "ddplab sweep's modes"),
    "cli/train.py": ("tests/unit/test_config.py", "test_every_shipped_recipe_parses", "flags, presets, files"),
    "data/dataset.py": ("tests/unit/data/test_loader.py", IMPORTS, "in-memory datasets"),
    "data/datasets.py": ("tests/unit/data/test_formats.py", IMPORTS, "CIFAR, STL-10, folders"),
    "data/options.py": ("tests/unit/test_config.py", "test_bad_values_name_the_field", "the data settings' choices"),
    "engine/clocks.py": ("tests/unit/metrics/test_stragglers.py", IMPORTS, "each rank's step and join times"),
    "engine/comm.py": (DDP, "test_per_rank_table_and_time_breakdown", "DDP's timers and the probe, 2 ranks"),
    "engine/data_init.py": (SPEEDRUN, IMPORTS, "whitening from the data"),
    "engine/evaluate.py": (DDP, IMPORTS, "eval equals the run's"),
    "engine/graphed.py": ("tests/unit/engine/test_graphed.py", "test_static_step_trains_like_the_plain_loop_cpu",
                          "the captured step"),
    "engine/lookahead.py": (SPEEDRUN, IMPORTS, "the speedrun's EMA"),
    "engine/makedir.py": ("tests/unit/rundir/test_runplan.py",
                          "test_a_run_folder_moved_while_it_trains_stops_the_run_and_resumes_where_it_went",
                          "the folder as a run starts"),
    "engine/muon.py": (SPEEDRUN, IMPORTS, "Muon"),
    "engine/phases.py": ("tests/unit/engine/test_trainer.py", "test_phase_timer_times_one_step_in_n_and_extrapolates",
                         "where a step's time goes"),
    "engine/precision.py": (SPEEDRUN, IMPORTS, "autocast and scaler"),
    "engine/probe.py": (SWEEP_RUNS, "test_a_sweep_survives_failures_and_a_rerun_resumes", "a sweep's probe"),
    "engine/readings.py": (DDP, "test_per_rank_table_and_time_breakdown", "CPU and memory of each rank"),
    "engine/state.py": ("tests/unit/rundir/test_epochs.py", IMPORTS, "the loop's state, round trip"),
    "engine/tta.py": (SPEEDRUN, IMPORTS, "evaluation with TTA"),
    "engine/warmup.py": ("tests/unit/engine/test_trainer.py", "test_warm_up_changes_nothing_the_run_depends_on",
                         "every shape before the clocks"),
    "errors.py": (ERRORS, "test_error_contract", "each error's line and exit code"),
    "io/arguments.py": ("tests/unit/test_config.py", IMPORTS, "option kinds at their borders"),
    "kernels/_cuda.py": ("tests/kernels/test_rgb_to_gray.py", IMPORTS, "the CUDA C++ kernel"),
    "kernels/_runtime.py": ("tests/kernels/test_rgb_to_gray.py", IMPORTS, "backend choice"),
    "kernels/_triton.py": ("tests/kernels/test_conv_relu.py", IMPORTS, "the Triton kernels"),
    "kernels/fuse.py": ("tests/kernels/test_fuse.py", "test_fused_registry_model_gives_identical_outputs_and_gradients",
                        "a model's conv+ReLU pairs fused"),
    "kernels/selftest.py": ("tests/smoke/test_gpu_check.py", "test_cpu_safe_part_runs_and_tabulates",
                            "`ddplab kernels check`"),
    "launch/elastic.py": (DDP, "test_two_workers_with_accumulation_equal_one_big_batch", "the launcher, for real"),
    "launch/tracked.py": ("tests/smoke/test_mlflow.py", "test_a_run_logs_its_config_epochs_and_files_to_a_sqlite_store",
                          "a run's report on its MLflow run"),
    "launch/warm/client.py": (WARM, "test_torchs_native_log_level_is_the_childs_own", "a client's warm children"),
    "launch/warm/fresh.py": (WARM, "test_torchs_native_log_level_is_the_childs_own", "a fork made what exec makes"),
    "launch/warm/protocol.py": ("tests/unit/io/test_environment.py", "test_every_spelling_of_off_turns_warm_starts_off",
                                "the switch, what both sides share"),
    "launch/warm/server.py": (WARM, "test_a_server_that_dies_takes_none_of_its_children_with_it", "the fork server"),
    "launch/warm/spawn.py": (WARM, "test_a_run_started_warm_ends_bit_identical_to_one_started_cold",
                             "DDP workers forked warm"),
    "log.py": (DDP, "test_a_stuck_rank_becomes_an_error_naming_it", "each rank's log line (its time and rank)"),
    "metrics/early_stop.py": ("tests/unit/engine/test_optim.py", IMPORTS, "the early-stop rule"),
    "metrics/meters.py": (DDP, "test_global_test_accuracy_equals_single_process_eval_of_saved_weights",
                          "device-side sums, all-reduced"),
    "metrics/mlflow_sink.py": ("tests/smoke/test_mlflow.py", IMPORTS, "MLflow, for real"),
    "metrics/system.py": ("tests/distributed/test_network.py",
                          "test_a_link_cut_mid_epoch_ends_every_host_in_one_line_and_the_run_resumes_exactly",
                          "env.json: the machine and its link"),
    "models/fastnet.py": (SPEEDRUN, IMPORTS, "the speedrun's net"),
    "models/resnet.py": (REGISTRY, "test_the_four_families_are_registered", "every registered model"),
    "models/registry.py": (REGISTRY, "test_the_four_families_are_registered",
                           "the registry, through the package that registers every family first"),
    "models/simple_cnn.py": (REGISTRY, "test_the_four_families_are_registered", "every registered model"),
    "models/vgg.py": (REGISTRY, "test_the_four_families_are_registered", "every registered model"),
    "planner/command.py": (PLAN, "test_plan_command_prints_the_table_and_writes_plan_json",
                           "what `ddplab plan` prints and writes"),
    "planner/published.py": ("tests/unit/planner/test_band.py", IMPORTS, "published figures"),
    "report/findings.py": ("tests/unit/report/test_findings.py", "test_a_super_linear_speedup_is_flagged_not_stated",
                           "findings, through the report that says them"),
    "report/records.py": ("tests/unit/report/test_figures.py", IMPORTS, "a run's and a point's rows"),
    "report/tables.py": ("tests/unit/report/test_headline.py", IMPORTS, "how figures are said"),
    "rundir/checkpoint.py": ("tests/unit/rundir/test_runplan.py",
                             "test_the_checkpoint_read_for_the_checks_is_handed_over_once",
                             "what a resume reads, checked"),
    "rundir/runfolder.py": ("tests/unit/test_config.py", IMPORTS, "what a run folder may be used for"),
    "rundir/runread.py": ("tests/unit/rundir/test_runread.py", "test_unfinished_run_is_listed_not_fatal",
                          "a folder read back, through the report"),
    "seeding.py": ("tests/unit/data/test_loader.py", "test_different_rank_gets_different_augmentation_draws",
                   "per (seed, epoch, rank) streams"),
    "sweep/executor.py": ("tests/unit/sweep/test_slurm.py", IMPORTS, "the executor protocol"),
    "sweep/local.py": (SWEEP_RUNS, "test_a_killed_sweep_leaves_no_run_training_and_a_rerun_finishes_it",
                       "local sweeps, for real"),
    "sweep/point.py": (SWEEP_RUNS, "test_a_sweep_survives_failures_and_a_rerun_resumes", "one point, any executor"),
    "sweep/run.py": (SWEEP_RUNS, "test_a_sweep_runs_from_python_as_the_command_runs_it", "a sweep from Python"),
    "sweep/trackers.py": (SWEEP_RUNS, IMPORTS, "a sweep tracker told its start and end"),
    "sweepdir/folder.py": ("tests/unit/sweepdir/test_spec.py", IMPORTS, "the manifest"),
    "topology.py": ("tests/unit/test_config.py", IMPORTS, "which launcher started this process"),
}
# fmt: on


def modules() -> list[str]:
    return sorted(
        str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if p.name != "__init__.py" and "__pycache__" not in p.parts
    )


def dotted(module: str) -> str:
    return "ddplab." + module.removesuffix(".py").replace("/", ".")


def own_test(module: str) -> Path:
    """The module's own test file, by its path: tests/unit/a/test_b.py for ddplab/a/b.py (tests/kernels/ for the
    kernels, which have a tier of their own)."""
    path = Path(module)
    tier = Path("tests") if path.parts[0] == "kernels" else Path("tests/unit")
    return REPO / tier / path.parent / f"test_{path.stem}.py"


def imported(test_file: Path) -> set[str]:
    """Every module a test file imports, at any depth (a test's own `from ddplab.x import y` counts)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(test_file.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def functions_defined_in(test_file: Path) -> set[str]:
    return {n.name for n in ast.parse(test_file.read_text()).body if isinstance(n, ast.FunctionDef)}


def has_own_test(module: str) -> bool:
    own = own_test(module)
    return own.is_file() and dotted(module) in imported(own)


def test_every_module_has_its_own_test_or_says_where_it_is_tested():
    untested = [m for m in modules() if not has_own_test(m) and m not in WHERE]
    assert untested == [], f"give each a test at its path ({[str(own_test(m)) for m in untested]}) or a WHERE entry"
    stale = [m for m in WHERE if m not in modules() or has_own_test(m)]
    assert stale == [], f"WHERE names modules that are gone or have their own test file now: {stale}"


def test_each_entry_names_a_test_file_that_still_reaches_its_module():
    for module, (test_file, test, _) in WHERE.items():
        path = REPO / test_file
        assert path.is_file(), f"{module}: {test_file} does not exist"
        if test is IMPORTS:
            assert dotted(module) in imported(path), f"{module}: {test_file} no longer imports {dotted(module)}"
        else:
            assert test in functions_defined_in(path), f"{module}: {test_file} no longer has {test}"


def test_every_unit_test_file_sits_where_its_module_does():
    """A file under tests/unit/a/ is about ddplab/a/: its folder is one of the source's (a misplaced or stale file
    would make the map by path lie)."""
    folders = {p.relative_to(SRC) for p in SRC.rglob("*") if p.is_dir() and "__pycache__" not in p.parts}
    for test_file in (REPO / "tests" / "unit").rglob("test_*.py"):
        folder = test_file.parent.relative_to(REPO / "tests" / "unit")
        assert folder == Path(".") or folder in folders, f"{test_file}: no src/ddplab/{folder}"


def test_the_map_reads_imports_not_text():
    """A module named only in a comment or a string is not imported: the map would otherwise be satisfied by it."""
    probe = REPO / "tests" / "unit" / "test_config.py"
    assert "ddplab.config" in imported(probe) and "ddplab.engine.trainer" not in imported(probe)
