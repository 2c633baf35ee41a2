"""Config: TOML round trip, overrides, and one clear ConfigError per bad value."""

import dataclasses
import re
from pathlib import Path

import pytest

from ddplab.cli import SHORTCUTS, build_parser, config_from_args
from ddplab.config import RunConfig, build_config, load_toml, parse_dotted, save_config
from ddplab.errors import ConfigError

from support.settings import REPO


def parse(argv):
    return config_from_args(build_parser().parse_args(["train", *argv]))


def test_defaults_round_trip_through_toml(tmp_path):
    cfg = RunConfig()
    save_config(cfg, tmp_path / "c.toml")
    assert build_config(load_toml(tmp_path / "c.toml")) == cfg


def test_non_default_values_round_trip(tmp_path):
    cfg = build_config(
        {
            "data": {"subset": 1000, "image_size": 40},
            "optim": {"betas": [0.8, 0.9], "grad_clip": 1.5},
            "train": {"early_stop_metric": "test_acc"},
            "model": {"dropout": 0.1, "batchnorm": True},
        }
    )
    save_config(cfg, tmp_path / "c.toml")
    again = build_config(load_toml(tmp_path / "c.toml"))
    assert again == cfg and again.optim.betas == [0.8, 0.9] and again.model.batchnorm is True


def test_shortcuts_and_dotted_flags_override_the_file(tmp_path):
    (tmp_path / "c.toml").write_text("[train]\nepochs = 7\nbatch_size = 64\n[optim]\nlr = 0.2\n")
    cfg = parse(
        [
            "--config",
            str(tmp_path / "c.toml"),
            "--epochs",
            "3",
            "--optim.weight_decay",
            "0.01",
            "--model.compile",
            "--data.flip",
            "false",
            "--out",
            str(tmp_path / "run"),
        ]
    )
    assert (cfg.train.epochs, cfg.train.batch_size, cfg.optim.lr, cfg.optim.weight_decay) == (3, 64, 0.2, 0.01)
    assert cfg.model.compile is True and cfg.data.flip is False


def test_every_shortcut_names_a_real_field():
    cfg = RunConfig().to_dict()
    for key in SHORTCUTS.values():
        section, name = key.split(".")
        assert name in {f.name for f in dataclasses.fields(getattr(RunConfig(), section))}, key
    assert set(cfg) == {"data", "model", "optim", "train", "dist", "output"}


def test_the_cli_surface_is_deliberate():
    """Changing the set of train flags must be a conscious act (update this list)."""
    flags = sorted(
        o
        for a in build_parser()._subparsers._group_actions[0].choices["train"]._actions
        for o in a.option_strings
        if not o.startswith("--") or "." not in o
    )
    assert flags == sorted(["-h", "--help", "--config", "--preset", "--resume", "--debug", *SHORTCUTS])


@pytest.mark.parametrize(
    "values, field",
    [
        ({"model": {"name": "resnet99"}}, "model.name"),
        ({"train": {"batch_size": 0}}, "train.batch_size"),
        ({"train": {"batch_size": 2.5}}, "train.batch_size"),
        ({"optim": {"lr": -0.1}}, "optim.lr"),
        ({"optim": {"lr": 0}}, "optim.lr"),
        ({"optim": {"name": "lion"}}, "optim.name"),
        ({"optim": {"schedule": "exponential"}}, "optim.schedule"),
        ({"optim": {"momentum": 1.5}}, "optim.momentum"),
        ({"optim": {"label_smoothing": 1.0}}, "optim.label_smoothing"),
        ({"optim": {"betas": [0.9]}}, "optim.betas"),
        ({"train": {"precision": "fp8"}}, "train.precision"),
        ({"train": {"device": "tpu"}}, "train.device"),
        ({"train": {"epochs": "many"}}, "train.epochs"),
        ({"train": {"early_stop_metric": "val_f1"}}, "train.early_stop_metric"),
        ({"train": {"profile_steps": -1}}, "train.profile_steps"),
        ({"train": {"profile_steps": True}}, "train.profile_steps"),
        ({"train": {"profile_steps": 5, "cuda_graphs": True}}, "train.profile_steps"),
        ({"data": {"dataset": "mnist"}}, "data.dataset"),
        ({"data": {"val_fraction": 1.0}}, "data.val_fraction"),
        ({"data": {"fold": 3}}, "data.fold"),
        ({"data": {"subset": -5}}, "data.subset"),
        ({"data": {"test_subset": 0}}, "data.test_subset"),
        ({"data": {"test_subset": 100, "val_fraction": 0.1}}, "data.test_subset"),
        ({"train": {"eval_train_images": -1}}, "train.eval_train_images"),
        ({"dist": {"strategy": "fsdp"}}, "dist.strategy"),
        ({"dist": {"backend": "ucc"}}, "dist.backend"),
        ({"dist": {"nproc": 2}}, "dist.nproc"),
        ({"model": {"nme": "x"}}, "model.nme"),
        ({"modle": {}}, "modle"),
        ({"optim": {"lr": float("nan")}}, "optim.lr"),
        ({"optim": {"grad_clip": "inf"}}, "optim.grad_clip"),
        ({"optim": {"warmup_epochs": float("inf")}}, "optim.warmup_epochs"),
        ({"train": {"seed": 2**70}}, "train.seed"),
        ({"dist": {"timeout_s": 10**12}}, "dist.timeout_s"),
        ({"model": {"compile": True, "compile_mode": "fast"}}, "model.compile_mode"),
        ({"model": {"compile_mode": "reduce-overhead"}}, "model.compile_mode"),  # without compile
    ],
)
def test_bad_values_name_the_field(values, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        build_config(values)


TWO_NODES = {"strategy": "ddp", "nnodes": 2}


@pytest.mark.parametrize(
    "endpoint, nnodes, why",
    [
        ("10.0.0.1:65536", 1, "a port is 1 to 65535"),
        ("10.0.0.1:" + "9" * 400, 2, "a port is 1 to 65535"),
        ("10.0.0.1:0", 2, "port 0 picks a free port on each node by itself"),
        ("10.0.0.1", 1, "expected host:port"),
        (":29500", 1, "expected host:port"),
        ("10.0.0.1:-1", 1, "expected host:port"),
        ("fd00::1:29500", 1, "an IPv6 address in brackets"),
    ],
)
def test_a_rendezvous_endpoint_past_its_border_is_refused_naming_why(endpoint, nnodes, why):
    dist = {**TWO_NODES, "nnodes": nnodes} if nnodes > 1 else {}
    with pytest.raises(ConfigError, match=rf"dist\.rdzv_endpoint=.* is not valid: .*{re.escape(why)}") as exc:
        build_config({"dist": {**dist, "rdzv_endpoint": endpoint}})
    assert len(str(exc.value).splitlines()) == 1 and len(str(exc.value)) < 300


@pytest.mark.parametrize(
    "endpoint, nnodes, parts",
    [
        ("10.0.0.1:29500", 2, ("10.0.0.1", 29500)),
        ("node-0.cluster:65535", 2, ("node-0.cluster", 65535)),
        ("[fd00::1]:29500", 2, ("fd00::1", 29500)),
        ("localhost:0", 1, ("localhost", 0)),  # one node: a free port of the store's choosing
    ],
)
def test_a_rendezvous_endpoint_within_its_border_is_read(endpoint, nnodes, parts):
    from ddplab.io.arguments import endpoint_parts

    dist = {**TWO_NODES, "nnodes": nnodes} if nnodes > 1 else {}
    assert build_config({"dist": {**dist, "rdzv_endpoint": endpoint}}).dist.rdzv_endpoint == endpoint
    assert endpoint_parts(endpoint, nodes=nnodes) == parts


@pytest.mark.parametrize(
    "argv, said",
    [
        (["plan", "--measure", "--nnodes", "2", "--rdzv-endpoint", "10.0.0.1:70000"], "a port is 1 to 65535"),
        (["plan", "run", "--gpus", "9" * 400], "is not a comma-separated list of whole numbers from 1 to"),
        (["plan", "run", "--gpus", "4294967296"], "from 1 to 2147483647"),
        (["plan", "--measure", "--max-mib", "9" * 400], "is not a whole number from 1 to"),
    ],
)
def test_a_count_or_port_past_its_border_is_argparses_one_line(capsys, argv, said):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and said in err[-1] and len(err[-1]) < 300


def test_port_0_for_two_nodes_is_refused_by_plan_measure_before_any_process(tmp_path):
    from ddplab import cli

    args = build_parser().parse_args(["plan", "--measure", "--nnodes", "2", "--rdzv-endpoint", "10.0.0.1:0"])
    with pytest.raises(ConfigError, match="port 0 picks a free port on each node by itself"):
        cli.refuse_unmeasurable(args)


def test_error_names_value_and_allowed():
    with pytest.raises(ConfigError) as exc:
        build_config({"optim": {"name": "lion"}})
    assert "'lion'" in str(exc.value) and "sgd, adam, adamw, rmsprop" in str(exc.value)


def test_parse_dotted_rejects_malformed():
    assert parse_dotted(["optim.lr=0.1"]) == {"optim": {"lr": "0.1"}}
    with pytest.raises(ConfigError):
        parse_dotted(["lr=0.1"])


def test_global_batch_size_is_local_times_world_times_accumulate():
    cfg = build_config(
        {
            "train": {"batch_size": 32, "accumulate": 4},
            "dist": {"strategy": "ddp", "nproc": 2, "nnodes": 2, "rdzv_endpoint": "127.0.0.1:29400"},
        }
    )
    assert cfg.world_size() == 4 and cfg.global_batch_size() == 32 * 4 * 4


RECIPES = sorted((REPO / "configs").glob("*.toml"))


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_shipped_recipe_parses(recipe):
    cfg = parse(["--config", str(recipe), "--out", "unused"])
    assert cfg.train.epochs >= 1


def test_there_are_recipes():
    assert len(RECIPES) >= 3


def test_the_configuration_reference_is_current():
    from ddplab.config import reference_markdown

    page = (REPO / "docs" / "configuration.md").read_text()
    assert reference_markdown() in page, "run: python scripts/readme_reference.py"


TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
}
SRUN = {
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "1",
    "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_STEP_NUM_NODES": "2",
}


def test_a_launchers_full_set_makes_a_worker_and_says_where_it_sits():
    from ddplab.topology import ProcessPlace, placement

    assert placement("ddp", {}).place is None
    assert placement("ddp", TORCHRUN).place == ProcessPlace(3, 4, 1, 2, "torchrun")
    assert placement("ddp", SRUN).place == ProcessPlace(5, 8, 1, 4, "srun")
    assert placement("ddp", SRUN).place.nnodes == 2
    one = {**TORCHRUN, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    assert placement("single", one).place is None  # torchrun --nproc 1: one process, no group


@pytest.mark.parametrize(
    "env, ignored",
    [
        ({"RANK": "0", "WORLD_SIZE": "2"}, "ignored RANK, WORLD_SIZE: without MASTER_ADDR, MASTER_PORT"),
        ({"RANK": "abc", "LOCAL_RANK": "x"}, "ignored RANK, LOCAL_RANK: without WORLD_SIZE, MASTER_ADDR, MASTER_PORT"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "7"}, "ignored SLURM_NTASKS=2: srun did not start"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, None),  # a one-task sbatch job: nothing to say
        ({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}, None),  # a multi-node user's shell: used by --nproc
    ],
)
@pytest.mark.parametrize("strategy", ["single", "ddp"])
def test_stray_launcher_variables_are_ignored_and_named(env, ignored, strategy):
    from ddplab.topology import placement

    got = placement(strategy, env)
    assert got.place is None
    assert (got.ignored or None) == ignored or got.ignored.startswith(ignored)


@pytest.mark.parametrize(
    "env, message",
    [
        ({**TORCHRUN, "RANK": "abc"}, "environment variable RANK='abc' is not a whole number >= 0"),
        ({**TORCHRUN, "WORLD_SIZE": "0"}, "WORLD_SIZE='0' is not a whole number >= 1"),
        ({**TORCHRUN, "LOCAL_WORLD_SIZE": "abc"}, "LOCAL_WORLD_SIZE='abc' is not a whole number"),
        ({**TORCHRUN, "RANK": "9" * 400}, "RANK='9999"),
        ({**TORCHRUN, "RANK": "4"}, "RANK=4 but the group has 4 processes"),
        ({**TORCHRUN, "LOCAL_WORLD_SIZE": "3"}, "LOCAL_RANK=1 with 3 processes per node does not fit a group of 4"),
        ({k: v for k, v in TORCHRUN.items() if k not in ("LOCAL_RANK",)}, "LOCAL_RANK is not set"),
        ({**SRUN, "SLURM_STEP_NUM_NODES": "3"}, "srun started 8 tasks on 3 nodes"),
        ({**SRUN, "SLURM_PROCID": "-1"}, "SLURM_PROCID='-1' is not a whole number >= 0"),
    ],
)
def test_a_malformed_launcher_variable_that_would_be_used_is_one_line(env, message):
    from ddplab.errors import ConfigError
    from ddplab.topology import placement

    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        placement("ddp", env)
    assert "\n" not in str(info.value) and len(str(info.value)) < 400


@pytest.mark.parametrize("env, launcher", [(TORCHRUN, "torchrun as rank 3 of 4"), (SRUN, "srun as rank 5 of 8")])
@pytest.mark.parametrize("strategy", ["single", "dp"])
def test_a_worker_that_asks_for_one_process_is_refused(env, launcher, strategy):
    from ddplab.errors import ConfigError
    from ddplab.topology import placement

    with pytest.raises(
        ConfigError, match=f"started by {launcher} .* dist.strategy={strategy} trains one process: pass --strategy ddp"
    ):
        placement(strategy, env)


def test_workers_may_share_one_device_over_gloo_only():
    from ddplab.distributed import rank_device

    config = build_config({"dist": {"strategy": "ddp", "nproc": 2, "share_device": True}})
    assert config.dist.share_device and config.world_size() == 2
    with pytest.raises(ConfigError, match=r"dist\.backend='nccl' .*share_device needs gloo \(NCCL refuses two ranks"):
        build_config({"dist": {"strategy": "ddp", "nproc": 2, "share_device": True, "backend": "nccl"}})
    with pytest.raises(ConfigError, match=r"dist\.share_device=true .*only under --strategy ddp"):
        build_config({"dist": {"share_device": True}})
    # Each rank's device: its own GPU, or GPU 0 for all when they share; the CPU is the CPU.
    assert [rank_device("cuda", r, cuda=True) for r in (0, 1)] == ["cuda:0", "cuda:1"]
    assert [rank_device("cuda", r, shared=True, cuda=True) for r in (0, 1)] == ["cuda:0", "cuda:0"]
    assert rank_device("auto", 1, shared=True, cuda=True) == "cuda:0" and rank_device("auto", 1) == "cpu"
    assert rank_device("cuda:1", 0, shared=True, cuda=True) == "cuda:1"


def test_backend_auto_is_resolved_in_one_place():
    from ddplab.topology import resolve_backend

    assert resolve_backend("auto", on_cuda=True) == "nccl"
    assert resolve_backend("auto", on_cuda=True, shared_device=True) == "gloo"  # NCCL refuses two ranks on one GPU
    assert resolve_backend("auto", on_cuda=False) == "gloo"
    assert resolve_backend("mpi", on_cuda=True) == "mpi"


def test_a_worker_records_the_shape_its_launcher_gave():
    from ddplab.topology import as_launched, placement

    config = build_config({"dist": {"strategy": "ddp"}})
    ran = as_launched(config, placement("ddp", SRUN).place)
    assert (ran.dist.nproc, ran.dist.nnodes, ran.dist.node_rank, ran.world_size()) == (4, 2, 1, 8)
    assert ran.dist.rdzv_endpoint  # a multi-node config must name one, or it would not load again
    assert build_config(ran.to_dict()).world_size() == 8
    assert as_launched(ran, placement("ddp", SRUN).place) is ran


def test_registries_and_config_choices_agree():
    from ddplab.config import MODELS
    from ddplab.models import list_models

    assert sorted(MODELS) == list_models()


def test_the_data_vocabulary_has_one_torch_free_owner_that_the_config_reads():
    """config.py reads data/options.py; no module of the data layer imports the config (no import cycle)."""
    import ast

    src = REPO / "src" / "ddplab"
    for path in (src / "data").glob("*.py"):
        imported = {node.module for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ImportFrom)}
        assert "ddplab.config" not in imported, path.name
    options = ast.parse((src / "data" / "options.py").read_text())
    assert not [
        n
        for n in ast.walk(options)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        and any("torch" in a.name or "ddplab" in (getattr(n, "module", "") or a.name) for a in n.names)
    ]


@pytest.mark.parametrize(
    "data, world, batch, images",
    [
        ({"dataset": "cifar10", "subset": 100}, 1, 128, 100),
        ({"dataset": "cifar10"}, 8, 8192, 6250),  # 50,000 over 8 ranks
        ({"dataset": "stl10", "fold": 3}, 2, 512, 500),  # a fold is 1,000 images
        ({"dataset": "synthetic", "synthetic_size": 100}, 3, 40, 34),  # padded to 102: 34 per rank
    ],
)
def test_drop_last_without_a_batch_is_refused_by_the_config(data, world, batch, images):
    """Before any process starts or data is read: each rank's share of the training set is smaller than a batch."""
    values = {
        "data": data,
        "train": {"batch_size": batch, "drop_last": True, "device": "cpu"},
        "dist": {"strategy": "ddp", "nproc": world} if world > 1 else {},
    }
    with pytest.raises(ConfigError, match=rf"train\.drop_last=true .* leaves no training batch: .*\b{images}\b"):
        build_config(values)
    values["train"]["batch_size"] = images  # exactly one batch each: allowed
    assert build_config(values).train.drop_last
    values["train"].update(batch_size=batch, drop_last=False)
    assert build_config(values).train.batch_size == batch  # a ragged batch is a batch


def test_drop_last_of_an_image_folder_is_counted_when_it_is_read(tmp_path):
    assert build_config(
        {
            "data": {"dataset": "imagefolder", "data_dir": str(tmp_path)},
            "train": {"batch_size": 10**6, "drop_last": True},
        }
    ).train.drop_last


def test_config_file_that_is_a_folder(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        load_toml(tmp_path)


def test_the_test_suite_collects_every_test_folder(request):
    """pytest skips folders named like build outputs (`dist`, `build`) by default: none of ours may be (checked
    against the patterns this very run recurses past, not a copy of pytest's defaults)."""
    import fnmatch

    root = REPO
    skipped = request.config.getini("norecursedirs")
    assert "dist" in skipped or any(fnmatch.fnmatch("dist", pattern) for pattern in skipped)  # the trap is there
    for folder in (p for p in (root / "tests").rglob("*") if p.is_dir() and any(p.glob("test_*.py"))):
        for part in folder.relative_to(root).parts:
            assert not any(fnmatch.fnmatch(part, pattern) for pattern in skipped), f"{folder} is not collected"


def test_the_run_folder_is_named_once_and_the_callers_config_is_left_alone(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    unnamed = build_config({"data": {"dataset": "synthetic"}, "model": {"name": "simple_cnn"}})
    named = unnamed.with_out_folder()
    assert unnamed.output.out is None  # the API's caller keeps its config
    assert Path(named.output.out).parent == Path("runs") and Path(named.output.out).name.startswith(
        "synthetic-simple_cnn-"
    )
    assert named.with_out_folder() is named  # every later step (the workers, train()) sees the same folder
    assert unnamed.with_out_folder().output.out != named.output.out  # two runs started together never share one


def test_a_run_folder_that_processes_cannot_agree_on_is_refused_and_a_given_one_is_expanded(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun without --standalone or --rdzv-id
    with pytest.raises(ConfigError, match=r"output\.out.*pass --out"):
        build_config({}).with_out_folder()
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    two_nodes = {"dist": {"strategy": "ddp", "nnodes": 2, "rdzv_endpoint": "10.0.0.1:29500"}}
    with pytest.raises(ConfigError, match="multi-node"):
        build_config(two_nodes).with_out_folder()
    given = build_config({**two_nodes, "output": {"out": "~/runs/x"}}).with_out_folder()
    assert given.output.out == str(Path.home() / "runs" / "x")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", r"config\.toml is not the config\.toml ddplab wrote for this run \(it is empty\)"),
        (
            "[train]\nepochs = 4\n",
            r"config\.toml is not the config\.toml ddplab wrote for this run \(no \[data\], \[model\], "
            r"\[optim\], \[dist\], \[output\]\)",
        ),
        (None, r"config\.toml: unknown config section \[extras\].*\(edited since the run wrote it\?\)"),
    ],
)
def test_a_run_config_not_as_ddplab_wrote_it_is_refused_naming_the_file(tmp_path, text, error):
    """What a resume reads a run's settings from (runfolder.saved_config): never filled in with defaults."""
    from ddplab.rundir.runfolder import saved_config

    save_config(build_config({"data": {"dataset": "synthetic"}}), tmp_path / "config.toml")
    assert saved_config(tmp_path).data.dataset == "synthetic"
    path = tmp_path / "config.toml"
    path.write_text(path.read_text() + "\n[extras]\nnote = 1\n" if text is None else text)
    with pytest.raises(ConfigError, match=error):
        saved_config(tmp_path)


@pytest.mark.parametrize(
    "argv, env, says",
    [
        (["--train.cuda_graphs", "true"], {}, "CUDA graphs need a CUDA device"),
        (["--strategy", "dp"], {}, "DataParallel needs CUDA devices"),
        (["--strategy", "ddp", "--nproc", "2"], {"DDPLAB_FAULT": "kill:rank=2:epoch=1"}, "rank=2 would never fire"),
        ([], {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "9"}, "pass --strategy ddp"),
    ],
)
def test_a_run_refused_on_a_cpu_is_refused_before_torch_is_imported(argv, env, says, tmp_path):
    """torch takes seconds to import on a small CPU: with --device cpu, what this machine cannot run is said first."""
    import os
    import subprocess
    import sys

    argv = ["train", "--dataset", "synthetic", "--device", "cpu", "--out", str(tmp_path / "r"), *argv]
    code = f"import sys\nfrom ddplab.cli import main\ncode = main({argv!r})\n"
    code += "assert 'torch' not in sys.modules\nsys.exit(code)"
    env = {**os.environ, **env}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2 and says in proc.stderr.strip().splitlines()[-1], proc.stderr[-2000:]
    assert not (tmp_path / "r").exists()


def test_cuda_graphs_takes_auto_besides_true_and_false(tmp_path):
    """A setting of `bool | Literal["auto"]` takes the word from the command line and from TOML, and says both
    kinds in its error."""
    assert parse(["--train.cuda_graphs", "auto"]).train.cuda_graphs == "auto"
    assert parse(["--train.cuda_graphs", "AUTO"]).train.cuda_graphs == "auto"
    assert parse(["--train.cuda_graphs", "true"]).train.cuda_graphs is True
    assert parse([]).train.cuda_graphs is False
    with pytest.raises(ConfigError, match=r"train\.cuda_graphs='maybe' is not valid: expected bool or 'auto'"):
        build_config({"train": {"cuda_graphs": "maybe"}})
    with pytest.raises(ConfigError, match=r"train\.cuda_graphs=2 is not valid: expected bool or 'auto'"):
        build_config({"train": {"cuda_graphs": 2}})
    cfg = build_config({"train": {"cuda_graphs": "auto"}})
    save_config(cfg, tmp_path / "c.toml")
    assert 'cuda_graphs = "auto"' in (tmp_path / "c.toml").read_text()
    assert build_config(load_toml(tmp_path / "c.toml")) == cfg


def test_nnodes_min_max_is_a_membership_that_may_change_and_says_what_it_needs():
    """torchrun's --nnodes MIN:MAX: the fewest nodes the run goes on with, refused without what a change needs."""
    base = ["--strategy", "ddp", "--rdzv-endpoint", "10.0.0.1:29500"]
    cfg = parse([*base, "--nnodes", "2:3", "--dist.on_resize", "keep_global_batch", "--max-restarts", "2"])
    assert (cfg.dist.min_nodes, cfg.dist.nnodes, cfg.dist.elastic(), cfg.world_size()) == (2, 3, True, 3)
    assert not parse([*base, "--nnodes", "3"]).dist.elastic()
    assert not parse([*base, "--nnodes", "3:3"]).dist.elastic()  # MIN = MAX: fixed, as today
    with pytest.raises(ConfigError) as bare:
        parse([*base, "--nnodes", "2:3"])
    assert str(bare.value) == (
        "dist.min_nodes=2 is not valid: a membership that may change needs --dist.on_resize keep_global_batch or "
        "keep_local_batch (what a smaller group trains), --max-restarts 1 or more (each change restarts the group)"
    )
    with pytest.raises(ConfigError, match=r"dist.min_nodes=4 is not valid: at most dist.nnodes=3"):
        parse([*base, "--nnodes", "4:3"])
    with pytest.raises(ConfigError, match=r"--dist.rdzv_backend c10d \(ranks by arrival\)"):
        parse([*base, "--nnodes", "2:3", "--dist.on_resize", "keep_global_batch", "--max-restarts", "1",
               "--dist.rdzv_backend", "static"])  # fmt: skip


def test_every_declared_kind_refuses_a_value_outside_it_naming_the_setting():
    """Each setting's kind is declared once, on its field (Annotated[type, KIND], io/borders' kinds): check_kinds
    refuses a value outside it in the section's own words, and the reference prints the same kind."""
    from ddplab import config as c

    reference = c.reference_markdown()
    checked = 0
    for section, cls in c.SECTIONS.items():
        for name, kind in c._kinds(section):
            bad = "not-a-choice" if kind.what.startswith("one of") else -1
            with pytest.raises(
                ConfigError, match=rf"^{section}\.{name}=\S+ is not valid: must be {re.escape(kind.what[:12])}"
            ):
                cls(**{name: bad})
            assert f"| `{section}.{name}` | " in reference and kind.what.removesuffix(" or null") in reference
            checked += 1
    assert checked >= 60  # every section declares its settings' kinds
