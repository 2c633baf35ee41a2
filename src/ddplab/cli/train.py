"""`ddplab train` and `ddplab eval`: a config from a file, a preset and flags, checked before torch is imported."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from pathlib import Path
from typing import Any

from ddplab.cli.common import quiet_native_logs
from ddplab.config import SECTIONS, RunConfig, build_config, coerce, field_types, load_toml, merge, parse_dotted
from ddplab.errors import ConfigError
from ddplab.io import files
from ddplab.rundir import runfiles

# Short flags for the settings people change most; every setting also has --section.field.
SHORTCUTS: dict[str, str] = {
    "--dataset": "data.dataset",
    "--data-dir": "data.data_dir",
    "--subset": "data.subset",
    "--model": "model.name",
    "--optimizer": "optim.name",
    "--lr": "optim.lr",
    "--schedule": "optim.schedule",
    "--epochs": "train.epochs",
    "--batch-size": "train.batch_size",
    "--accumulate": "train.accumulate",
    "--precision": "train.precision",
    "--device": "train.device",
    "--seed": "train.seed",
    "--strategy": "dist.strategy",
    "--nproc": "dist.nproc",
    "--backend": "dist.backend",
    "--nnodes": "dist.nnodes",
    "--node-rank": "dist.node_rank",
    "--rdzv-endpoint": "dist.rdzv_endpoint",
    "--max-restarts": "dist.max_restarts",
    "--out": "output.out",
}


def _is_bool(hint: Any) -> bool:
    return hint is bool or bool in typing.get_args(hint)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", type=files.user_path, default=argparse.SUPPRESS, help="TOML config file (e.g. a run's config.toml)"
    )
    parser.add_argument(
        "--preset",
        default=argparse.SUPPRESS,
        metavar="NAME",
        help="a recipe that ships with ddplab, as a base for the flags: " + ", ".join(list_presets()),
    )
    for flag, key in SHORTCUTS.items():
        section, name = key.split(".")
        parser.add_argument(flag, dest=key, metavar=name.upper(), default=argparse.SUPPRESS, help=f"same as --{key}")
    parser.add_argument(
        "--resume",
        dest="output.resume",
        action="store_const",
        const="true",
        default=argparse.SUPPRESS,
        help="continue the run in --out from its last checkpoint",
    )
    parser.add_argument(
        "--debug",
        dest="output.debug",
        action="store_const",
        const="true",
        default=argparse.SUPPRESS,
        help="show tracebacks",
    )
    add_section_arguments(parser)


def add_section_arguments(parser: argparse.ArgumentParser) -> None:
    """--section.field for every setting of every section, a bool's value optional (--train.compile = true)."""
    for section, cls in SECTIONS.items():
        group = parser.add_argument_group(f"[{section}] settings")
        hints = field_types(section)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[operator]
            kwargs: dict[str, Any] = dict(
                dest=f"{section}.{f.name}",
                default=argparse.SUPPRESS,
                help=f"{f.metadata.get('help', '')} (default: {default})",
            )
            if _is_bool(hints[f.name]):
                kwargs.update(nargs="?", const="true", metavar="BOOL")
            else:
                kwargs.update(metavar=f.name.upper())
            group.add_argument(f"--{section}.{f.name}", **kwargs)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """Config file (or a resumed run's config.toml), then every flag given, validated."""
    return config_and_saved(args)[0]


def config_and_saved(args: argparse.Namespace) -> tuple[RunConfig, RunConfig | None]:
    """The config, and for `--resume` the run's saved config.toml as read here: the run's plan compares
    the two without reading the file again."""
    saved = None
    overrides = parse_dotted([f"{k}={v}" for k, v in vars(args).items() if "." in k])
    nodes = overrides.get("dist", {}).get("nnodes")
    if isinstance(nodes, str) and ":" in nodes:  # torchrun's --nnodes MIN:MAX
        overrides["dist"]["min_nodes"], _, overrides["dist"]["nnodes"] = nodes.partition(":")
    output = overrides.get("output", {})
    resume = coerce("output.resume", output.get("resume", False), bool)
    if hasattr(args, "config") and hasattr(args, "preset"):
        raise ConfigError(
            "--config and --preset both give a base recipe: choose one, and change single settings with flags"
        )
    if hasattr(args, "preset"):
        base = load_toml(preset_path(args.preset))
    elif hasattr(args, "config"):
        base = load_toml(args.config)
    elif resume and "out" in output:  # resume with the run's own settings
        from ddplab.rundir.runfolder import saved_config

        path = Path(output["out"]) / runfiles.CONFIG
        if not path.is_file():
            raise ConfigError(
                f"output.resume: {output['out']} holds no run to resume (no config.toml there); "
                "start a new run there without --resume"
            )
        saved = saved_config(path.parent)
        base = saved.to_dict()
    else:
        base = {}
    return build_config(merge(base, overrides)), saved


PRESETS = Path(__file__).parent.parent / "presets"


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.toml"))


def preset_path(name: str) -> Path:
    path = PRESETS / f"{name}.toml"
    if name not in list_presets():
        raise ConfigError(f"--preset {name!r} does not exist: presets are " + ", ".join(list_presets()))
    return path


def cmd_train(args: argparse.Namespace) -> int:
    config, saved = config_and_saved(args)  # validated before torch is imported: a bad value is answered at once
    if config.dist.nnodes > 1:
        quiet_native_logs(config.output.debug)
    from ddplab.launch.elastic import launch

    launch(config, saved=saved)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from ddplab.engine.evaluate import evaluate_run

    data_dir = str(args.data_dir) if args.data_dir is not None else None
    result = evaluate_run(args.run_dir, weights=args.weights, device=args.device, data_dir=data_dir, tta=args.tta)
    views = "" if result["tta"] == "none" else f", tta {result['tta']}"
    print(
        f"{result['run_dir']} ({result['weights']} weights, epoch {result['epoch']}{views}): "
        f"{result['split']} acc {result['acc']:.4%} ({result['correct']}/{result['count']}), "
        f"{result['split']} loss {result['loss']:.4f}"
    )
    return 0


def add_train(sub) -> None:
    p = sub.add_parser("train", help="train a model (see --help for every setting)")
    add_config_arguments(p)
    p.set_defaults(func=cmd_train)


def add_eval(sub) -> None:
    p = sub.add_parser("eval", help="test loss/accuracy of a run's final or best weights")
    p.add_argument("run_dir", type=files.user_path)
    p.add_argument("--weights", choices=("final", "best"), default="final")
    p.add_argument("--device", default="auto")
    p.add_argument("--data-dir", type=files.user_path, default=None, help="data root, if it moved since training")
    p.add_argument(
        "--tta", default=None, help="test-time augmentation: none | flip | flip_translate (default: the run's own)"
    )
    p.set_defaults(func=cmd_eval)
