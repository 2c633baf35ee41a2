"""The error contract, one row per bad input or fault: docs/contracts.md's promise, checked as a user meets it.

Each row runs `python -m ddplab ...` in a fresh process, as a user would, and checks: the
exit code (2 config, 3 data, 4 training, 5 file system, 0 when there is nothing wrong), the
one `ddplab: error:` line (last on stderr, matching a pattern that names cause and fix), no
traceback unless --debug, no process left behind, and what the run folder holds afterwards.
Every new option and command gets its rows here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch

from support import tiers
from support.cli import ddplab_cli
from support.readers import leftover_processes

S = [
    "train",
    "--dataset",
    "synthetic",
    "--data.synthetic_size",
    "256",
    "--data.image_size",
    "16",
    "--model.width",
    "0.5",
    "--epochs",
    "1",
    "--device",
    "cpu",
    "--output.progress",
    "false",
    "--output.tensorboard",
    "false",
]
SHARED = {}  # one finished run, built once, copied into the rows that need one


@dataclass
class Case:
    id: str
    args: list[str]
    code: int
    line: str = ""  # regex the one error line must match ("" when code is 0)
    setup: Callable[[Path], None] | None = None
    after: Callable[[Path], None] | None = None
    debug: bool = False  # --debug: a traceback is expected, the line and code stay
    alone: bool = False  # the error line is all of stderr (no usage screen, no log lines)
    env: dict[str, str] | None = None  # set for the command, on top of this process's environment
    note: str = ""  # regex stderr must match besides the error line (a note on what was ignored)
    says: str = ""  # regex stdout must match (what a command that succeeds reports)


def finished_run(tmp: Path, name: str = "run") -> Path:
    """A copy of one finished 1-epoch run (made once per session)."""
    import shutil

    if "run" not in SHARED:
        base = SHARED["factory"].mktemp("finished")
        proc = ddplab(*S, "--out", str(base / "run"))
        assert proc.returncode == 0, proc.stderr
        SHARED["run"] = base / "run"
    tmp.mkdir(parents=True, exist_ok=True)
    shutil.copytree(SHARED["run"], tmp / name)
    return tmp / name


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def unchanged_after(setup: Callable[[Path], None]):
    """A setup that records the folder, and an `after` that asserts nothing in it changed."""
    state = {}

    def do_setup(tmp):
        setup(tmp)
        state["before"] = snapshot(tmp)

    def check(tmp):
        assert snapshot(tmp) == state["before"]

    return do_setup, check


def shown_as_replacement(name, shown="run\ufffd"):
    """`name` holds `shown` (a name of bytes that are not UTF-8, shown with U+FFFD), and it and every page and table
    beside it are valid UTF-8."""

    def check(tmp):
        assert shown in (tmp / name).read_text(encoding="utf-8")
        for path in (tmp / name).parent.rglob("*"):
            if path.suffix in (".html", ".md", ".csv", ".json"):
                path.read_text(encoding="utf-8")

    return check


def tilde_expanded(name):
    """`name` is under the home folder (the test's), and no folder named ~ was made beside it."""

    def check(tmp):
        assert (tmp / name).is_file() and not any(p.name == "~" for p in tmp.rglob("~")), sorted(
            p.name for p in tmp.iterdir()
        )

    return check


def no_folder(name):
    def check(tmp):
        assert not (tmp / name).exists(), sorted(p.name for p in (tmp / name).iterdir())

    return check


def strict_json_everywhere(name):
    def check(tmp):
        for path in (tmp / name).rglob("*.json*"):
            for line in path.read_text().splitlines() if path.suffix == ".jsonl" else [path.read_text()]:
                json.loads(line, parse_constant=lambda c, path=path: pytest.fail(f"{path} holds {c}: not JSON"))
        assert not list((tmp / name).rglob("*.tmp"))

    return check


def foreign_checkpoint(tmp):
    run = finished_run(tmp)
    torch.save({"foo": 1}, run / "checkpoints" / "last.pt")


def random_bytes_checkpoint(tmp):
    run = finished_run(tmp)
    (run / "checkpoints" / "last.pt").write_bytes(os.urandom(4096))


def bad_value_in_the_checkpoints_config(tmp):
    """A checkpoint whose recorded config holds a value no ddplab writes (edited, or another program's)."""
    last = finished_run(tmp) / "checkpoints" / "last.pt"  # the one that records its config (best.pt: weights)
    state = torch.load(last, weights_only=True)
    state["config"]["train"]["epochs"] = "many"
    torch.save(state, last)


def other_model_in_config(tmp):
    run = finished_run(tmp)
    config = run / "config.toml"
    config.write_text(config.read_text().replace('name = "simple_cnn"', 'name = "vgg_small"'))


def truncated(name):
    def setup(tmp):
        run = finished_run(tmp)
        text = (run / name).read_bytes()
        (run / name).write_bytes(text[: len(text) // 2])

    return setup


def corrupt_cifar(tmp):
    folder = tmp / "data" / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        (folder / name).write_bytes(bytes(3073) * 3)
    (folder / "data_batch_2.bin").write_bytes(bytes(3073) * 3 + b"\0" * 100)
    (folder / "batches.meta.txt").write_text("\n".join("abcdefghij") + "\n")


def image_folder_with(*classes, images: int = 1):
    """An image folder whose train split has these classes (`images` each), an empty one named 'empty' left empty."""

    def setup(tmp):
        from PIL import Image

        for cls in classes:
            (tmp / "imgs" / "train" / cls).mkdir(parents=True)
            for i in range(images if cls != "empty" else 0):
                Image.new("RGB", (8, 8)).save(tmp / "imgs" / "train" / cls / f"{i}.png")

    return setup


def one_good_one_truncated(tmp):
    finished_run(tmp, "good")
    bad = finished_run(tmp, "bad")
    text = (bad / "summary.json").read_bytes()
    (bad / "summary.json").write_bytes(text[: len(text) // 2])


def report_lists_the_unreadable_run(tmp):
    md = (tmp / "rep" / "report.md").read_text()
    assert "- bad (unreadable): " in md and "summary.json line" in md and "good" in md


def run_with_a_binary_env_json(tmp):
    (finished_run(tmp) / "env.json").write_bytes(b"\x00\x01\xff")


def report_draws_the_run_and_says_env_json_was_left_out(tmp):
    md = (tmp / "rep" / "report.md").read_text()
    assert "run (unreadable)" not in md and "1 runs (1 finished)" in md, md  # the run is drawn
    assert re.search(r"run/env\.json (cannot be read|line 1 is not JSON).*: left out", md), md


def sweep_folder_whose_manifest_is_a_folder(tmp):
    finished_run(tmp / "sw" / "runs", "a")
    (tmp / "sw" / "manifest.json").mkdir()


def sweep_file(tmp, grid):
    if not torch.cuda.is_available() or "nccl" not in grid:
        (tmp / "s.toml").write_text(
            f'[base.data]\ndataset = "synthetic"\n[base.train]\ndevice = "cpu"\n[grid]\n{grid}\n'
        )
    else:  # on a CUDA machine, ask for what no machine has
        (tmp / "s.toml").write_text(
            '[base.data]\ndataset = "synthetic"\n[base.train]\ndevice = "cuda:99"\n[grid]\n"dist.backend" = ["nccl"]\n'
        )


def sweep_text(text):
    def setup(tmp):
        (tmp / "s.toml").write_text(text)

    return setup


def a_file(tmp):
    (tmp / "file").write_text("not a folder")


def bad_toml(tmp):
    (tmp / "bad.toml").write_text("[train\nepochs = ")


def unknown_section(tmp):
    (tmp / "x.toml").write_text("[trian]\nepochs = 2\n")


def edited_json(rel: str, edit: Callable[[dict], object]):
    """A finished run (and a links file measured on this machine's model of it) whose file `rel` ('run/summary.json',
    'links.json') is edited by `edit` (a JSON object in, changed in place)."""

    def setup(tmp):
        finished_run(tmp)
        write_links(tmp / "links.json")
        path = tmp / rel
        data = json.loads(path.read_text())
        edit(data)
        path.write_text(json.dumps(data))

    return setup


def edited_line(rel: str, number: int, **fields):
    """A finished run whose JSONL file `rel` has `fields` set on its line `number` (1-based)."""

    def setup(tmp):
        finished_run(tmp)
        path = tmp / rel
        lines = path.read_text().splitlines()
        lines[number - 1] = json.dumps({**json.loads(lines[number - 1]), **fields})
        path.write_text("\n".join(lines) + "\n")

    return setup


def write_links(path: Path) -> None:
    """A links file as `ddplab plan --measure` writes it, for a link of 1 GB/s and 1 ms (no measuring: exact times)."""
    sizes = [4096 * 4**i for i in range(6)]
    times = [0.001 + s * 2 * (2 - 1) / 2 / 1e9 for s in sizes]
    path.write_text(
        json.dumps(
            {
                "measurement": {
                    "backend": "gloo",
                    "ranks": 2,
                    "nodes": 1,
                    "device": "cpu",
                    "sizes": sizes,
                    "times_s": times,
                    "wall_s": 1.0,
                },
                "more": [],
            }
        )
    )


def sweep_folder(edit: Callable[[dict], object] | None = None, links: str | None = None, executor: str | None = None):
    """A sweep folder holding the finished run as its one point ('a'), its manifest edited by `edit`; `links`: the
    text of its links.json; `executor`: 'slurm' makes it a submitted Slurm sweep of job 7."""

    def setup(tmp):
        from support.runs import write_manifest

        finished_run(tmp / "sw" / "runs", "a")
        write_manifest(
            tmp / "sw", [{"name": "a", "point": {"train.batch_size": 128}, "seed": 0}], axes=["train.batch_size"]
        )
        path = tmp / "sw" / "manifest.json"
        manifest = json.loads(path.read_text())
        if executor:
            manifest.update(executor=executor, slurm_jobs=["7"])
            manifest["runs"][0].update(status="submitted", job="7_0")
            (tmp / "sw" / "runs" / "a" / "summary.json").unlink()
        if edit:
            edit(manifest)
        path.write_text(json.dumps(manifest))
        (tmp / "sw" / "sweep.toml").write_text(
            '[base.data]\ndataset = "synthetic"\n[grid]\n"train.batch_size" = [128]\n'
        )
        if links is not None:
            (tmp / "sw" / "links.json").write_text(links)

    return setup


def slurm_tools(sbatch: str = "", squeue: str = ""):
    """Slurm's sbatch and squeue, on PATH in {tmp}/bin, answering these texts (exit 0); a sweep file beside them."""

    def setup(tmp):
        (tmp / "bin").mkdir(exist_ok=True)
        for tool, answer in (("sbatch", sbatch), ("squeue", squeue)):
            (tmp / "bin" / tool).write_text(f"#!/bin/sh\ncat <<'EOF'\n{answer}\nEOF\n")
            (tmp / "bin" / tool).chmod(0o755)

    return setup


def combined(*setups):
    def setup(tmp):
        for one in setups:
            one(tmp)

    return setup


def report_says(*texts):
    def check(tmp):
        md = (tmp / "rep" / "report.md").read_text()
        assert all(text in md for text in texts), md

    return check


def no_job_recorded(tmp):
    manifest = json.loads((tmp / "out" / "manifest.json").read_text())
    assert [e["job"] for e in manifest["runs"]] == [None] and manifest.get("jobs") == [], manifest


resume_nothing_setup, resume_nothing_after = unchanged_after(finished_run)


def config_rewritten(text):
    """A finished run whose config.toml now holds `text` (a function of the old text)."""

    def setup(tmp):
        path = finished_run(tmp) / "config.toml"
        path.write_text(text(path.read_text()))

    return unchanged_after(setup)


resume_empty_setup, resume_empty_after = config_rewritten(lambda old: "")
resume_edited_setup, resume_edited_after = config_rewritten(
    lambda old: "\n".join("lr = 0.5" if line.startswith("lr = ") else line for line in old.splitlines()) + "\n"
)
sweep_into_run_setup, sweep_into_run_after = unchanged_after(
    lambda tmp: (finished_run(tmp), sweep_file(tmp, '"train.batch_size" = [8]'))
)
foreign_setup, foreign_after = unchanged_after(foreign_checkpoint)

CASES = [
    # Usage errors: one line with a pointer to --help; a flag is never abbreviated into another.
    Case(
        "abbreviated-flag",
        [*S, "--train.epoch", "3", "--out", "{tmp}/r"],
        2,
        r"unrecognized arguments: --train\.epoch 3; did you mean --train\.epochs\? \(see ddplab --help\)$",
        alone=True,
        after=no_folder("r"),
    ),
    Case("misspelt-command", ["trian"], 2, r"invalid choice: 'trian' .*\(see ddplab --help\)$", alone=True),
    Case(
        "flag-without-value",
        ["train", "--lr"],
        2,
        r"argument --lr: expected one argument \(see ddplab train --help\)$",
        alone=True,
    ),
    Case("sweep-flag-typo", ["sweep", "assignment", "--dryrun"], 2, r"did you mean --dry-run\?", alone=True),
    # modes that exclude each other are one line, never one dropped in silence; a value a command would cap or
    # cannot honour is said or refused before any process starts
    Case(
        "sweep-list-with-a-file",
        ["sweep", "assignment", "--list"],
        2,
        r"ddplab sweep: --list and a sweep file cannot go together",
        alone=True,
    ),
    Case(
        "sweep-status-with-dry-run",
        ["assignment", "--status", "--dry-run", "--out", "{tmp}/o"],
        2,
        r"--status and --dry-run cannot go together",
        alone=True,
        after=no_folder("o"),
    ),
    Case(
        "sweep-dry-run-with-wait",
        ["sweep", "assignment", "--executor", "slurm", "--dry-run", "--wait"],
        2,
        r"--dry-run and --wait cannot go together",
        alone=True,
    ),
    Case(
        "plan-run-with-measure",
        ["plan", "{tmp}/run", "--measure"],
        2,
        r"ddplab plan: a run folder and --measure cannot go together",
        alone=True,
        setup=lambda tmp: finished_run(tmp),
    ),
    Case(
        "plan-published-with-measure",
        ["plan", "--published", "--measure"],
        2,
        r"--measure and --published cannot go together",
        alone=True,
    ),
    Case(
        "plan-message-past-the-largest",
        ["plan", "--measure", "--max-mib", "4096", "--out", "{tmp}/l.json"],
        2,
        r"--max-mib 4096: messages are timed from 4 KiB up by 4x to 1024 MiB; give 1 to 1024",
        alone=True,
        after=no_folder("l.json"),
    ),
    Case(
        "plan-ranks-past-the-cores",
        ["plan", "--measure", "--nproc", "4096", "--backend", "gloo", "--out", "{tmp}/l.json"],
        2,
        r"--nproc 4096: this process may use \d+ CPU core\(s\); past \d+ processes \(4 a core\) the all-reduce's time "
        r"is the scheduler's",
        alone=True,
        after=no_folder("l.json"),
    ),
    # an option the mode given does nothing with is one line, never dropped: a run's prediction takes no --nproc
    Case(
        "plan-run-with-measure-options",
        ["plan", "{tmp}/run", "--nproc", "4", "--max-mib", "4"],
        2,
        r"ddplab plan: --nproc, --max-mib do nothing for a run folder's prediction \(those options are --measure's\): "
        r"leave them out$",
        alone=True,
        setup=lambda tmp: finished_run(tmp),
    ),
    Case(
        "plan-measure-with-prediction-options",
        ["plan", "--measure", "--gpus", "4", "--out", "{tmp}/l.json"],
        2,
        r"--gpus does nothing with --measure \(those options are for a run folder's prediction\)",
        alone=True,
        after=no_folder("l.json"),
    ),
    Case(
        "plan-published-with-a-links-file",
        ["plan", "--published", "--links-file", "{tmp}/l.json"],
        2,
        r"--links-file does nothing with --published: leave it out$",
        alone=True,
    ),
    Case(
        "plan-corpus-with-a-batch",
        ["plan", "--corpus", "--batch", "32"],
        2,
        r"--batch does nothing with --corpus: leave it out$",
        alone=True,
    ),
    Case(
        "sweep-status-with-parallel",
        ["sweep", "assignment", "--status", "--parallel", "2", "--no-report"],
        2,
        r"ddplab sweep: --parallel, --no-report do nothing with --status \(it reads the sweep folder, runs nothing\)",
        alone=True,
    ),
    Case(
        "sweep-list-with-out", ["sweep", "--list", "--out", "{tmp}/o"], 2, r"--out does nothing with --list", alone=True
    ),
    Case(
        "flag-of-another-command",
        ["report", "{tmp}", "--resume"],
        2,
        r"--resume is an option of ddplab train",
        alone=True,
    ),
    Case(
        "sweep-debug", ["sweep", "{tmp}/nope.toml", "--debug"], 2, r"sweep file .*nope\.toml does not exist", debug=True
    ),
    # configuration (exit 2): the field, the value and what is allowed
    Case(
        "batch-size-0",
        [*S, "--batch-size", "0", "--out", "{tmp}/r"],
        2,
        r"train\.batch_size=0 .*>= 1",
        after=no_folder("r"),
    ),
    Case(
        "unknown-model",
        [*S, "--model", "resnet99", "--out", "{tmp}/r"],
        2,
        r"model\.name='resnet99'.*simple_cnn",
        after=no_folder("r"),
    ),
    Case(
        "epochs-0-debug",
        [*S, "--epochs", "0", "--debug", "--out", "{tmp}/r"],
        2,
        r"train\.epochs=0",
        debug=True,
        after=no_folder("r"),
    ),
    Case(
        "400-digit-epochs",
        [*S, "--epochs", "9" * 400, "--out", "{tmp}/r"],
        2,
        r"train\.epochs=9{12}\.\.\. \(400 digits\) is not valid: must be below 2\*\*62 in size$",
        alone=True,
        after=no_folder("r"),
    ),
    Case(
        "400-digit-subset",
        [*S, "--subset", "9" * 400, "--out", "{tmp}/r"],
        2,
        r"data\.subset=9{12}\.\.\. \(400 digits\) is not valid: must be below 2\*\*62",
        alone=True,
    ),
    Case("nan-lr", [*S, "--lr", "nan", "--out", "{tmp}/r"], 2, r"optim\.lr='nan'.*finite number"),
    Case(
        "cuda-graphs-with-fp16",
        [*S, "--train.cuda_graphs", "true", "--precision", "fp16", "--out", "{tmp}/r"],
        2,
        r"train\.precision='fp16' .*cuda_graphs: fp16's gradient scaler",
        after=no_folder("r"),
    ),
    Case(
        "cuda-graphs-on-cpu",
        [*S, "--train.cuda_graphs", "true", "--out", "{tmp}/r"],
        2,
        r"train\.cuda_graphs=true .*CUDA graphs need a CUDA device",
        after=no_folder("r"),
    ),
    Case(
        "channels-last-neither-bool-nor-auto",
        [*S, "--model.channels_last", "maybe", "--out", "{tmp}/r"],
        2,
        r"model\.channels_last='maybe' is not valid: expected bool or 'auto'$",
        after=no_folder("r"),
    ),
    Case(
        "unknown-preset",
        ["train", "--preset", "fastest", "--out", "{tmp}/r"],
        2,
        r"--preset 'fastest' does not exist: presets are speedrun",
        after=no_folder("r"),
    ),
    Case(
        "bad-flip-mode",
        [*S, "--data.flip_mode", "sometimes", "--out", "{tmp}/r"],
        2,
        r"data\.flip_mode='sometimes' .*random, alternate",
        after=no_folder("r"),
    ),
    Case(
        "bad-tta",
        [*S, "--train.tta", "rotate", "--out", "{tmp}/r"],
        2,
        r"train\.tta='rotate' .*none, flip, flip_translate",
        after=no_folder("r"),
    ),
    Case(
        "muon-lr-0",
        [*S, "--optim.muon_lr", "0", "--out", "{tmp}/r"],
        2,
        r"optim\.muon_lr=0\.0 .*> 0",
        after=no_folder("r"),
    ),
    Case(
        "muon-momentum-1",
        [*S, "--optim.muon_momentum", "1", "--out", "{tmp}/r"],
        2,
        r"optim\.muon_momentum=1\.0 .*\[0, 1\)",
        after=no_folder("r"),
    ),
    Case(
        "muon-ns-steps-text",
        [*S, "--optim.muon_ns_steps", "three", "--out", "{tmp}/r"],
        2,
        r"optim\.muon_ns_steps",
        after=no_folder("r"),
    ),
    Case(
        "lookahead-alpha-0",
        [*S, "--optim.lookahead_alpha", "0", "--out", "{tmp}/r"],
        2,
        r"optim\.lookahead_alpha=0\.0 .*\(0, 1\]",
        after=no_folder("r"),
    ),
    Case(
        "threads-0",
        [*S, "--train.threads", "0", "--out", "{tmp}/r"],
        2,
        r"train\.threads=0 .*whole number >= 1",
        after=no_folder("r"),
    ),
    Case(
        "profile-steps-negative",
        [*S, "--train.profile_steps", "-1", "--out", "{tmp}/r"],
        2,
        r"train\.profile_steps=-1 .*whole number >= 0",
        after=no_folder("r"),
    ),
    Case(
        "share-device-with-nccl",
        [
            *S,
            "--strategy",
            "ddp",
            "--nproc",
            "2",
            "--dist.share_device",
            "true",
            "--backend",
            "nccl",
            "--out",
            "{tmp}/r",
        ],
        2,
        r"dist\.backend='nccl' is not valid: --dist\.share_device needs gloo",
        alone=True,
        after=no_folder("r"),
    ),
    Case(
        "share-device-single",
        [*S, "--dist.share_device", "true", "--out", "{tmp}/r"],
        2,
        r"dist\.share_device=true is not valid: workers share a device only under --strategy ddp",
        alone=True,
    ),
    Case(
        "checkpoint-every-not-a-count",
        [*S, "--train.checkpoint_every", "5h", "--out", "{tmp}/r"],
        2,
        r"train\.checkpoint_every='5h' is not valid: epoch, a number of steps >= 1, or Ns / Nm \(time\)$",
        alone=True,
        after=no_folder("r"),
    ),
    Case(
        "on-resize-unknown",
        [*S, "--dist.on_resize", "shrink", "--out", "{tmp}/r"],
        2,
        r"dist\.on_resize='shrink' is not valid: must be one of refuse, keep_global_batch, keep_local_batch$",
        alone=True,
    ),
    Case(
        "nnodes-min-max-without-a-policy",
        [*S, "--strategy", "ddp", "--nnodes", "2:3", "--rdzv-endpoint", "127.0.0.1:29500", "--out", "{tmp}/r"],
        2,
        r"dist\.min_nodes=2 is not valid: a membership that may change needs --dist\.on_resize keep_global_batch or "
        r"keep_local_batch \(what a smaller group trains\), --max-restarts 1 or more",
        alone=True,
        after=no_folder("r"),
    ),
    Case("nproc-without-ddp", [*S, "--nproc", "2", "--out", "{tmp}/r"], 2, r"dist\.nproc=2.*--strategy ddp"),
    Case(
        "dp-gpus-without-dp",
        [*S, "--dist.dp_gpus", "2", "--out", "{tmp}/r"],
        2,
        r"dist\.dp_gpus=2 is not valid: applies with --strategy dp",
    ),
    Case(
        "dp-on-a-cpu",
        [*S, "--strategy", "dp", "--dist.dp_gpus", "2", "--out", "{tmp}/r"],
        2,
        r"DataParallel needs CUDA devices",
    ),
    Case(
        "missing-config-file", ["train", "--config", "{tmp}/nope.toml"], 2, r"config file .*nope\.toml does not exist"
    ),
    Case("bad-toml", ["train", "--config", "{tmp}/bad.toml"], 2, r"bad\.toml is not valid TOML", setup=bad_toml),
    Case(
        "unknown-section",
        ["train", "--config", "{tmp}/x.toml"],
        2,
        r"unknown config section \[trian\]",
        setup=unknown_section,
    ),
    Case(
        "resume-without-run",
        ["train", "--out", "{tmp}/x", "--resume"],
        2,
        r"holds no run to resume .*without --resume",
        after=no_folder("x"),
    ),
    Case(
        "finished-run-not-overwritten",
        [*S, "--out", "{tmp}/run"],
        2,
        r"already holds a finished run",
        setup=resume_nothing_setup,
        after=resume_nothing_after,
    ),
    Case("foreign-folder", [*S, "--out", "{tmp}"], 2, r"not a ddplab run folder", setup=a_file),
    Case(
        "config-edited-to-another-model",
        ["train", "--out", "{tmp}/run", "--resume", "--epochs", "2"],
        2,
        r"run/config\.toml was edited after the run's last checkpoint \(model\.name: 'simple_cnn' in the checkpoint, "
        r"'vgg_small' in the file\)",
        setup=other_model_in_config,
    ),
    Case(
        "eval-of-a-config-edited-to-another-model",
        ["eval", "{tmp}/run", "--device", "cpu"],
        2,
        r"run/config\.toml was edited after the run's last checkpoint \(model\.name: 'simple_cnn' in the checkpoint, "
        r"'vgg_small' in the file\): eval would build another model",
        setup=other_model_in_config,
    ),
    Case(
        "resume-a-checkpoint-recording-a-bad-value",
        ["train", "--out", "{tmp}/run", "--resume", "--epochs", "2"],
        3,
        r"run/checkpoints/last\.pt: the config it recorded is not one ddplab writes \(train\.epochs='many' is not "
        r"valid",
        setup=bad_value_in_the_checkpoints_config,
    ),
    Case(
        "eval-of-a-checkpoint-recording-a-bad-value",
        ["eval", "{tmp}/run", "--device", "cpu"],
        3,
        r"run/checkpoints/last\.pt: the config it recorded is not one ddplab writes",
        setup=bad_value_in_the_checkpoints_config,
    ),
    Case(
        "warm-switch-that-is-none",
        [*S, "--out", "{tmp}/run"],
        2,
        r"DDPLAB_WARM='maybe' is not a switch: use one of 1, true, on, yes to turn it on, 0, false, off, no",
        env={"DDPLAB_WARM": "maybe"},
        after=no_folder("run"),
    ),
    Case("eval-not-a-run", ["eval", "{tmp}"], 2, r"not a ddplab run folder"),
    Case(
        "eval-unknown-tta",
        ["eval", "{tmp}/run", "--device", "cpu", "--tta", "mirror"],
        2,
        r"train\.tta=.mirror. is not valid: must be one of none, flip, flip_translate",
        setup=finished_run,
    ),
    Case("compare-a-file", ["compare", "{tmp}/file"], 2, r"is not a folder", setup=a_file),
    Case("compare-not-a-run", ["compare", "{tmp}"], 2, r"is not a finished ddplab run"),
    Case(
        "compare-a-run-with-itself",
        ["compare", "{tmp}/run", "{tmp}/run/"],
        0,
        setup=finished_run,
        note=r"ddplab: note: .*run given twice: compared once",
        says=r"\A(?![\s\S]*#2)[\s\S]*baseline",  # one row, the baseline: no second copy of it at 1.00x
    ),
    Case("sweep-missing-file", ["sweep", "{tmp}/nope.toml"], 2, r"sweep file .*nope\.toml does not exist"),
    Case(
        "sweep-bad-value",
        ["sweep", "{tmp}/s.toml", "--out", "{tmp}/out"],
        2,
        r"sweep run batch-size-0 .*train\.batch_size=0",
        setup=lambda tmp: sweep_file(tmp, '"train.batch_size" = [0]'),
        after=no_folder("out"),
    ),
    Case(
        "sweep-unknown-profile",
        ["sweep", "{tmp}/s.toml", "--profile", "huge"],
        2,
        r"has no profile 'huge'",
        setup=lambda tmp: sweep_file(tmp, '"train.batch_size" = [8]'),
    ),
    Case(
        "sweep-cannot-run-here",
        ["sweep", "{tmp}/s.toml", "--out", "{tmp}/out"],
        2,
        r"cannot run here: dist\.backend='nccl'",
        setup=lambda tmp: sweep_file(tmp, '"dist.backend" = ["nccl"]\n"dist.strategy" = ["ddp"]'),
        after=no_folder("out"),
    ),
    Case(
        "sweep-bad-set",
        ["sweep", "{tmp}/s.toml", "--set", "epochs=3"],
        2,
        r"override 'epochs=3' is not valid: write section\.field=value",
        setup=lambda tmp: sweep_file(tmp, '"train.batch_size" = [8]'),
    ),
    Case(
        "sweep-into-a-run-folder",
        ["sweep", "{tmp}/s.toml", "--out", "{tmp}/run"],
        2,
        r"--out .*/run is a run folder, not a sweep folder .*choose another --out",
        setup=sweep_into_run_setup,
        after=sweep_into_run_after,
    ),
    # sweep files of the wrong shape, or that would run something other than what they name: one line, nothing run
    Case(
        "sweep-grid-not-a-table",
        ["sweep", "{tmp}/s.toml", "--out", "{tmp}/out"],
        2,
        r"\[grid\] must be a table, got 5",
        setup=sweep_text('grid = 5\n[base.data]\ndataset = "synthetic"\n'),
        alone=True,
        after=no_folder("out"),
    ),
    Case(
        "sweep-scalar-variants",
        ["sweep", "{tmp}/s.toml", "--out", "{tmp}/out"],
        2,
        r"variants must be an array of tables",
        setup=sweep_text("variants = 5\n"),
        alone=True,
        after=no_folder("out"),
    ),
    Case(
        "sweep-string-seed",
        ["sweep", "{tmp}/s.toml", "--out", "{tmp}/out"],
        2,
        r"train\.seed='7' in \[base\.train\] is not valid: expected an integer",
        setup=sweep_text('[base.train]\nseed = "7"\n'),
        alone=True,
        after=no_folder("out"),
    ),
    Case(
        "sweep-grid-over-the-seed",
        ["sweep", "{tmp}/s.toml", "--out", "{tmp}/out"],
        2,
        r"grid\.train\.seed: the seed is set by \[sweep\] repeats",
        alone=True,
        after=no_folder("out"),
        setup=lambda tmp: sweep_file(tmp, '"train.seed" = [1, 2, 3]'),
    ),
    Case(
        "sweep-value-twice",
        ["sweep", "{tmp}/s.toml", "--out", "{tmp}/out"],
        2,
        r"grid\.train\.batch_size lists 8 twice",
        alone=True,
        after=no_folder("out"),
        setup=lambda tmp: sweep_file(tmp, '"train.batch_size" = [8, 8]'),
    ),
    Case(
        "sweep-set-over-an-axis",
        ["sweep", "{tmp}/s.toml", "--out", "{tmp}/out", "--set", "train.batch_size=4"],
        2,
        r"train\.batch_size",
        alone=True,
        after=no_folder("out"),
        setup=lambda tmp: sweep_file(tmp, '"train.batch_size" = [8, 16]'),
    ),
    Case(
        "sweep-negative-timeout",
        ["sweep", "assignment", "--timeout", "-5"],
        2,
        r"argument --timeout: '-5' is not a number of seconds > 0",
        alone=True,
    ),
    Case(
        "sweep-nan-timeout",
        ["assignment", "--timeout", "nan"],
        2,
        r"argument --timeout: 'nan' is not a number of seconds > 0",
        alone=True,
    ),
    Case(
        "sweep-zero-parallel",
        ["sweep", "assignment", "--parallel", "0"],
        2,
        r"argument --parallel: '0' is not a number of points to run at once \(a whole number >= 1\) or auto",
        alone=True,
    ),
    Case(
        "sweep-word-parallel",
        ["assignment", "--parallel", "all"],
        2,
        r"argument --parallel: 'all' is not a number",
        alone=True,
    ),
    Case(
        "sweep-parallel-over-the-cores",
        ["sweep", "{tmp}/s.toml", "--out", "{tmp}/out", "--parallel", "4096"],
        2,
        r"--parallel 4096: this process may use \d+ CPU core\(s\), and a point never gets fewer than one",
        alone=True,
        after=no_folder("out"),
        setup=lambda tmp: sweep_file(tmp, '"train.batch_size" = [8, 16]'),
    ),
    Case(
        "sweep-slurm-without-sbatch",
        ["sweep", "{tmp}/s.toml", "--out", "{tmp}/out", "--executor", "slurm"],
        2,
        r"sbatch is not installed here \(or not on PATH\): --executor slurm needs Slurm's client tools",
        alone=True,
        after=no_folder("out"),
        env={"PATH": "/nonexistent"},
        setup=lambda tmp: sweep_file(tmp, '"train.batch_size" = [8]'),
    ),
    Case(
        "sweep-slurm-option-alone",
        ["sweep", "{tmp}/s.toml", "--slurm.partition", "gpu"],
        2,
        r"--slurm\.partition is for --executor slurm",
        alone=True,
        setup=lambda tmp: sweep_file(tmp, '"train.batch_size" = [8]'),
    ),
    Case(
        "sweep-slurm-with-timeout",
        ["sweep", "{tmp}/s.toml", "--executor", "slurm", "--timeout", "60"],
        2,
        r"under Slurm give each point a limit with --slurm\.time",
        alone=True,
        setup=lambda tmp: sweep_file(tmp, '"train.batch_size" = [8]'),
    ),
    Case(
        "sweep-slurm-zero-gpus",
        ["sweep", "{tmp}/s.toml", "--executor", "slurm", "--slurm.gpus-per-node", "0"],
        2,
        r"argument --slurm\.gpus-per-node: '0' is not a whole number from 1 to 2147483647",
        alone=True,
    ),
    Case(
        "sweep-slurm-bad-extra",
        ["sweep", "{tmp}/s.toml", "--out", "{tmp}/out", "--executor", "slurm", "--slurm.extra=--mem='1G"],
        2,
        r"--slurm\.extra .* cannot be split into options",
        alone=True,
        after=no_folder("out"),
        setup=lambda tmp: sweep_file(tmp, '"train.batch_size" = [8]'),
    ),
    Case(
        "sweep-wait-on-a-local-sweep",
        ["sweep", "{tmp}/s.toml", "--out", "{tmp}/out", "--wait"],
        2,
        r"--wait waits for a sweep submitted with --executor slurm",
        alone=True,
        setup=lambda tmp: sweep_file(tmp, '"train.batch_size" = [8]'),
    ),
    Case(
        "sweep-unknown-executor",
        ["sweep", "assignment", "--executor", "k8s"],
        2,
        r"argument --executor: invalid choice: 'k8s' \(choose from '?local'?, '?slurm'?, '?ray'?\)",
        alone=True,
    ),
    Case(
        "sweep-on-ray-a-point-that-would-go-on-without-a-lost-node",
        ["sweep", "{tmp}/s.toml", "--out", "{tmp}/out", "--executor", "ray"],
        2,
        r"sweep run epochs-1 may go on without a lost node \(dist\.min_nodes=2 of 3\): on Ray a point's nodes are "
        r"its tasks, and a lost one ends the point, resumable",
        alone=True,
        after=no_folder("out"),
        setup=sweep_text(
            '[sweep]\nname = "elastic"\n[base.data]\ndataset = "synthetic"\n[base.dist]\nstrategy = "ddp"\nnnodes = 3\n'
            'min_nodes = 2\non_resize = "keep_global_batch"\nmax_restarts = 1\n[grid]\n"train.epochs" = [1]\n'
        ),
    ),
    Case(
        "sweep-status-of-nothing",
        ["sweep", "{tmp}/s.toml", "--out", "{tmp}/out", "--status"],
        2,
        r"holds no sweep manifest: run or submit the sweep first",
        alone=True,
        after=no_folder("out"),
        setup=lambda tmp: sweep_file(tmp, '"train.batch_size" = [8]'),
    ),
    Case(
        "train-two-nodes-without-endpoint",
        ["train", "--dataset", "synthetic", "--strategy", "ddp", "--nnodes", "2", "--out", "{tmp}/r"],
        2,
        r"a multi-node run started by ddplab's launcher needs host:port",
        alone=True,
        after=no_folder("r"),
    ),
    Case(
        "hosts-bad-rate",
        ["hosts", "up", "2", "--link", "5furlong"],
        2,
        r"link rate '5furlong': expected e\.g\. 100mbit, 1gbit, 2\.5gbit or none",
        alone=True,
    ),
    Case("hosts-too-many", ["hosts", "up", "65"], 2, r"hosts: 65: must be between 1 and 64", alone=True),
    Case(
        "hosts-bad-name",
        ["hosts", "status", "--name", "My-Cluster"],
        2,
        r"cluster name 'My-Cluster': 1 to 12 lower-case letters and digits",
        alone=True,
    ),
    Case(
        "hosts-status-of-nothing",
        ["hosts", "status", "--name", "nosuch"],
        2,
        r"no test cluster named 'nosuch': make one with `ddplab hosts up N`",
        alone=True,
    ),
    Case(
        "hosts-down-of-nothing", ["hosts", "down", "--name", "nosuch"], 2, r"no test cluster named 'nosuch'", alone=True
    ),
    Case(
        "plan-one-rank",
        ["plan", "--measure", "--nproc", "1"],
        2,
        r"--nproc 1: an all-reduce needs 2 or more ranks to measure a link",
        alone=True,
    ),
    Case(
        "plan-nccl-on-a-cpu",
        ["plan", "--measure", "--backend", "nccl"],
        2,
        r"(--backend nccl needs CUDA devices; use --backend gloo on a CPU|NCCL needs a GPU per rank)",
        alone=True,
    ),
    Case(
        "plan-nodes-without-endpoint",
        ["plan", "--measure", "--nnodes", "2"],
        2,
        r"--nnodes 2: every node needs --rdzv-endpoint host:port, the same on each",
        alone=True,
    ),
    Case(
        "plan-zero-mib",
        ["plan", "--measure", "--max-mib", "0"],
        2,
        r"argument --max-mib: '0' is not a whole number from 1 to 2147483647",
        alone=True,
    ),
    Case(
        "plan-unknown-link",
        ["plan", "{tmp}/run", "--link", "infiniband"],
        2,
        r"no link named 'infiniband': the links are nvlink, pcie5, pcie4, ib, 100gbe, 25gbe, 10gbe, measured, or a "
        r"links file's path \(\.json\)$",
        alone=True,
        setup=finished_run,
    ),
    Case(
        "plan-measured-link-missing",
        ["plan", "{tmp}/run", "--link", "measured", "--links-file", "{tmp}/none.json"],
        2,
        r"--link measured reads .*none\.json, which does not exist: measure this machine's link first",
        alone=True,
        setup=finished_run,
    ),
    Case(
        "plan-links-file-by-path-missing",
        ["plan", "{tmp}/run", "--nodes", "2", "--inter-link", "{tmp}/across.json"],
        2,
        r"the links file .*across\.json, which does not exist: measure this machine's link first",
        alone=True,
        setup=finished_run,
    ),
    Case(
        "plan-bad-gpu-list",
        ["plan", "{tmp}/run", "--gpus", "1,two"],
        2,
        r"argument --gpus: '1,two' is not a comma-separated list of whole numbers from 1 to 2147483647",
        alone=True,
    ),
    Case("plan-not-a-run", ["plan", "{tmp}"], 2, r"is not a finished ddplab run", alone=True),
    Case("sweep-without-file", ["sweep"], 2, r"give a sweep file or a bundled sweep's name \(ddplab sweep --list\)"),
    Case(
        "sweep-unknown-name",
        ["sweep", "precison"],
        2,
        r"'precison' is neither a sweep file nor a bundled sweep; "
        r"bundled: .*precision",
    ),
    Case("report-a-file", ["report", "{tmp}/file"], 2, r"is not a folder", setup=a_file),
    Case("report-no-runs", ["report", "{tmp}", "--out", "{tmp}/rep"], 2, r"no runs found under"),
    Case(
        "report-truncated-summary",
        ["report", "{tmp}/run", "--out", "{tmp}/rep"],
        3,
        r"summary\.json",
        setup=truncated("summary.json"),
    ),
    # data (exit 3): which file and what to do
    Case(
        "missing-dataset",
        [*S, "--dataset", "cifar10", "--data-dir", "{tmp}", "--data.download", "false", "--out", "{tmp}/r"],
        3,
        r"cifar-10-batches-bin",
    ),
    Case(
        "truncated-dataset",
        [*S, "--dataset", "cifar10", "--data-dir", "{tmp}/data", "--data.download", "false", "--out", "{tmp}/r"],
        3,
        r"data_batch_2\.bin",
        setup=corrupt_cifar,
    ),
    Case(
        "empty-class-folder",
        [*S, "--dataset", "imagefolder", "--data-dir", "{tmp}/imgs", "--data.val_fraction", "0.5", "--out", "{tmp}/r"],
        3,
        r"class folder .*imgs/train/empty holds no images",
        setup=image_folder_with("cat", "empty"),
    ),
    Case(
        "one-class",
        [*S, "--dataset", "imagefolder", "--data-dir", "{tmp}/imgs", "--data.val_fraction", "0.5", "--out", "{tmp}/r"],
        3,
        r"has 1 class sub-folder \(cat\): a classifier needs at least 2",
        setup=image_folder_with("cat"),
    ),
    # drop_last with fewer images per rank than a batch: from the config where the count is known (before any
    # worker or data), from the data where only reading counts them (an image folder).
    Case(
        "drop-last-no-batch",
        [
            *S,
            "--strategy",
            "ddp",
            "--nproc",
            "2",
            "--batch-size",
            "200",
            "--train.drop_last",
            "true",
            "--out",
            "{tmp}/r",
        ],
        2,
        r"train\.drop_last=true is not valid: it leaves no training batch: each of the 2 processes reads 128 of "
        r"the 256 training images, fewer than train\.batch_size=200",
        alone=True,
        after=no_folder("r"),
    ),
    Case(
        "drop-last-no-batch-image-folder",
        [
            *S,
            "--dataset",
            "imagefolder",
            "--data-dir",
            "{tmp}/imgs",
            "--data.val_fraction",
            "0.5",
            "--batch-size",
            "8",
            "--train.drop_last",
            "true",
            "--out",
            "{tmp}/r",
        ],
        2,
        r"train\.batch_size=8 with train\.drop_last leaves no training batch: this rank has 2 training images",
        setup=image_folder_with("cat", "dog", images=2),
    ),
    Case(
        "verify-truncated-dataset",
        ["data", "verify", "cifar10", "--data-dir", "{tmp}/data"],
        3,
        r"cifar10 in .*: FAILED, 1 error",
        setup=corrupt_cifar,
    ),
    Case(
        "foreign-checkpoint-eval",
        ["eval", "{tmp}/run", "--device", "cpu"],
        3,
        r"last\.pt is not a ddplab checkpoint: it lacks model, optimizer",
        setup=foreign_setup,
        after=foreign_after,
    ),
    Case(
        "foreign-checkpoint-resume",
        ["train", "--out", "{tmp}/run", "--resume", "--epochs", "2"],
        3,
        r"last\.pt is not a ddplab checkpoint",
        setup=foreign_checkpoint,
    ),
    Case(
        "random-bytes-checkpoint",
        ["eval", "{tmp}/run", "--device", "cpu"],
        3,
        r"last\.pt cannot be read: it is truncated, corrupt or not a PyTorch checkpoint",
        setup=random_bytes_checkpoint,
    ),
    Case(
        "compare-truncated-summary",
        ["compare", "{tmp}/run"],
        3,
        r"summary\.json line \d+ is not JSON .*truncated",
        setup=truncated("summary.json"),
    ),
    Case(
        "compare-truncated-metrics",
        ["compare", "{tmp}/run"],
        3,
        r"metrics\.jsonl line \d+ is not JSON",
        setup=truncated("metrics.jsonl"),
    ),
    # training (exit 4): what happened, what is kept, what to change
    Case(
        "non-finite-eval-loss",
        [*S, "--lr", "1e11", "--batch-size", "512", "--data.synthetic_size", "512", "--out", "{tmp}/r"],
        4,
        r"NaN/inf in epoch 1 .*last good checkpoint",
        after=strict_json_everywhere("r"),
    ),
    Case(
        "cpu-out-of-memory",
        [*S, "--model.width", "1e7", "--out", "{tmp}/r"],
        4,
        r"ran out of CPU memory .*lower --batch-size or --model\.width",
    ),
    Case(
        "ddp-worker-out-of-memory",
        [*S, "--strategy", "ddp", "--nproc", "2", "--model.width", "1e7", "--out", "{tmp}/r"],
        4,
        r"worker rank \d failed: rank \d ran out of CPU memory",
    ),
    # file system (exit 5): the path and the reason
    Case(
        "unwritable-out",
        [*S, "--out", "/sys/ddplab-contract/r"],
        5,
        r"cannot .*/sys/ddplab-contract.*Operation not permitted",
    ),
    Case("out-under-a-file", [*S, "--out", "{tmp}/file/r"], 5, r"cannot .*file/r.*Not a directory", setup=a_file),
    Case(
        "ddp-unwritable-out",
        [*S, "--strategy", "ddp", "--nproc", "2", "--out", "/sys/ddplab-contract/r"],
        5,
        r"cannot .*/sys/ddplab-contract",
    ),
    # what a command writes is checked writable before the work it would hold (a link measurement, a plan)
    Case(
        "plan-measure-unwritable-out",
        ["plan", "--measure", "--nproc", "2", "--out", "/sys/ddplab-contract/l.json"],
        5,
        r"cannot create the folder /sys/ddplab-contract: Operation not permitted$",
        alone=True,
    ),
    Case(
        "plan-out-in-proc",
        ["plan", "{tmp}/run", "--link", "nvlink", "--out", "/proc/ddplab-plan.json"],
        5,
        r"cannot write into /proc: ",
        alone=True,
        setup=lambda tmp: finished_run(tmp),
    ),
    Case(
        "report-unwritable-out",
        ["report", "{tmp}/run", "--out", "/sys/ddplab-contract/rep"],
        5,
        r"cannot create the folder /sys/ddplab-contract: Operation not permitted$",
        alone=True,
        setup=lambda tmp: finished_run(tmp),
    ),
    # stray launcher variables: partial sets are ignored and named; a full set asks for DDP; malformed is one line
    Case(
        "torchrun-set-without-ddp",
        [*S, "--out", "{tmp}/r"],
        2,
        r"started by torchrun as rank 0 of 2 \(RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT are set\), but "
        r"dist\.strategy=single trains one process: pass --strategy ddp",
        alone=True,
        after=no_folder("r"),
        env={"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "9"},
    ),
    Case(
        "srun-step-without-ddp",
        [*S, "--out", "{tmp}/r"],
        2,
        r"started by srun as rank 1 of 2 .*pass --strategy ddp",
        alone=True,
        after=no_folder("r"),
        env={"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2"},
    ),
    Case(
        "malformed-rank",
        [*S, "--strategy", "ddp", "--out", "{tmp}/r"],
        2,
        r"environment variable RANK='abc' is not a "
        r"whole number >= 0",
        alone=True,
        after=no_folder("r"),
        env={"RANK": "abc", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "9"},
    ),
    Case(
        "malformed-local-world-size",
        [*S, "--strategy", "ddp", "--out", "{tmp}/r"],
        2,
        r"LOCAL_WORLD_SIZE='abc' is not a whole number >= 1",
        alone=True,
        after=no_folder("r"),
        env={
            "RANK": "0",
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "abc",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "9",
        },
    ),
    # the fault hook (DDPLAB_FAULT) obeys a flag's contract: one line, exit 2, before anything starts, whatever the
    # command (a sweep's runs inherit it); a fault this run cannot fire is refused too
    Case(
        "fault-no-value",
        [*S, "--out", "{tmp}/r"],
        2,
        r"DDPLAB_FAULT='kill:rank': 'rank' is not FIELD=INTEGER",
        alone=True,
        after=no_folder("r"),
        env={"DDPLAB_FAULT": "kill:rank"},
    ),
    Case(
        "fault-not-a-number",
        [*S, "--strategy", "ddp", "--nproc", "2", "--out", "{tmp}/r"],
        2,
        r"DDPLAB_FAULT='kill:rank=one:epoch=1': 'rank=one' is not FIELD=INTEGER",
        alone=True,
        after=no_folder("r"),
        env={"DDPLAB_FAULT": "kill:rank=one:epoch=1"},
    ),
    Case(
        "fault-negative-delay",
        ["sweep", "{tmp}/s.toml", "--out", "{tmp}/out"],
        2,
        r"DDPLAB_FAULT='slow:ms=-5': ms=-5 would never fire \(the least ms is 0\)",
        alone=True,
        after=no_folder("out"),
        env={"DDPLAB_FAULT": "slow:ms=-5"},
        setup=lambda tmp: sweep_file(tmp, '"train.batch_size" = [8]'),
    ),
    Case(
        "fault-epoch-zero",
        ["plan", "--measure", "--nproc", "2"],
        2,
        r"DDPLAB_FAULT='raise:epoch=0': epoch=0 would never "
        r"fire",
        alone=True,
        env={"DDPLAB_FAULT": "raise:epoch=0"},
    ),
    Case(
        "fault-unknown-action",
        ["assignment", "--dry-run"],
        2,
        r"DDPLAB_FAULT='crash:rank=0': expected kill\|raise",
        alone=True,
        env={"DDPLAB_FAULT": "crash:rank=0"},
    ),
    Case(
        "fault-rank-past-the-world",
        [*S, "--strategy", "ddp", "--nproc", "2", "--out", "{tmp}/r"],
        2,
        r"DDPLAB_FAULT='kill:rank=2:epoch=1': rank=2 would never fire: this run has ranks 0 to 1",
        alone=True,
        after=no_folder("r"),
        env={"DDPLAB_FAULT": "kill:rank=2:epoch=1"},
    ),
    Case(
        "fault-epoch-past-the-run",
        [*S, "--out", "{tmp}/r"],
        2,
        r"DDPLAB_FAULT='raise:epoch=3': epoch=3 would never fire: this run trains 1 epoch$",
        alone=True,
        after=no_folder("r"),
        env={"DDPLAB_FAULT": "raise:epoch=3"},
    ),
    # every file ddplab reads and every answer of another program is checked at its border: a missing field, a wrong
    # type, zero where a count divides, NaN, 1e308, a 400-digit integer is one line naming the file and the field
    # (exit 3), or, where a file only adds to what is shown, left out and said
    Case(
        "report-summary-zero-workers",
        ["report", "{tmp}/run", "--out", "{tmp}/rep"],
        3,
        r"run/summary\.json: run\.world_size is 0, not a whole number >= 1$",
        alone=True,
        setup=edited_json("run/summary.json", lambda s: s["run"].update(world_size=0)),
        after=no_folder("rep"),
    ),
    Case(
        "plan-summary-text-batch",
        ["plan", "{tmp}/run", "--link", "nvlink", "--out", "{tmp}/p.json"],
        3,
        r"run/summary\.json: batch\.local is '128', not a whole number >= 1$",
        alone=True,
        setup=edited_json("run/summary.json", lambda s: s["batch"].update(local="128")),
        after=no_folder("p.json"),
    ),
    Case(
        "plan-summary-400-digit-params",
        ["plan", "{tmp}/run", "--link", "nvlink", "--out", "{tmp}/p.json"],
        3,
        r"model\.params is 999999999999\.\.\. \(400 digits\), not a whole number >= 1$",
        alone=True,
        setup=edited_json("run/summary.json", lambda s: s["model"].update(params=int("9" * 400))),
        after=no_folder("p.json"),
    ),
    Case(
        "compare-summary-nan-time",
        ["compare", "{tmp}/run"],
        3,
        r"run/summary\.json: time\.train_s is nan, not a number "
        r">= 0$",
        alone=True,
        setup=edited_json("run/summary.json", lambda s: s["time"].update(train_s=float("nan"))),
    ),
    Case(
        "report-summary-section-not-an-object",
        ["report", "{tmp}/run", "--out", "{tmp}/rep"],
        3,
        r"summary\.json: run is 'single', not a JSON object$",
        alone=True,
        setup=edited_json("run/summary.json", lambda s: s.update(run="single")),
    ),
    Case(
        "plan-metrics-negative-time",
        ["plan", "{tmp}/run", "--link", "nvlink", "--out", "{tmp}/p.json"],
        3,
        r"run/metrics\.jsonl line 1: train_s is -1\.0, not a number >= 0$",
        alone=True,
        setup=edited_line("run/metrics.jsonl", 1, train_s=-1.0),
        after=no_folder("p.json"),
    ),
    Case(
        "plan-links-zero-ranks",
        ["plan", "{tmp}/run", "--links-file", "{tmp}/links.json", "--out", "{tmp}/p.json"],
        3,
        r"links\.json: measurement\.ranks is 0, not a whole number >= 2$",
        alone=True,
        setup=edited_json("links.json", lambda d: d["measurement"].update(ranks=0)),
        after=no_folder("p.json"),
    ),
    Case(
        "plan-links-1e308-time",
        ["plan", "{tmp}/run", "--links-file", "{tmp}/links.json", "--out", "{tmp}/p.json"],
        3,
        r"links\.json: measurement\.times_s is .*, not a list, each item a number in \(0, 3600\]$",
        alone=True,
        setup=edited_json("links.json", lambda d: d["measurement"]["times_s"].__setitem__(2, 1e308)),
        after=no_folder("p.json"),
    ),
    Case(
        "report-sweep-links-not-a-measurement",
        ["report", "{tmp}/sw", "--out", "{tmp}/rep"],
        0,
        setup=sweep_folder(links='{"measurement": {"ranks": "two"}}'),
        after=report_says("links.json lacks measurement.backend, which ddplab always writes", "no predictions from it"),
    ),
    Case(
        "report-manifest-point-not-an-object",
        ["report", "{tmp}/sw", "--out", "{tmp}/rep"],
        3,
        r"sw/manifest\.json: runs\[0\]\.point is 'x', not a JSON object$",
        alone=True,
        setup=sweep_folder(lambda m: m["runs"][0].update(point="x")),
        after=no_folder("rep"),
    ),
    Case(
        "status-manifest-unknown-status",
        ["sweep", "{tmp}/sw/sweep.toml", "--status", "--out", "{tmp}/sw"],
        3,
        r"sw/manifest\.json: runs\[0\]\.status is 'done', not one of pending, running, finished",
        alone=True,
        setup=sweep_folder(lambda m: m["runs"][0].update(status="done")),
    ),
    Case(
        "report-env-text-cpus",
        ["report", "{tmp}/sw", "--out", "{tmp}/rep"],
        0,
        setup=combined(sweep_folder(), lambda tmp: (tmp / "sw/runs/a/env.json").write_text('{"cpus": "two"}')),
        after=report_says("env.json: cpus is 'two', not a whole number &gt;= 1: left out"),
    ),
    Case(
        "sweep-sbatch-answers-a-web-page",
        ["sweep", "{tmp}/s.toml", "--out", "{tmp}/out", "--executor", "slurm"],
        2,
        r"sbatch answered '<html><body>502 Bad Gateway</body></html>', not a job id \(JOB or JOB;CLUSTER\)",
        alone=False,
        env={"PATH": "{tmp}/bin:" + os.environ["PATH"]},
        after=no_job_recorded,
        setup=combined(
            slurm_tools(sbatch="<html><body>502 Bad Gateway</body></html>"),
            lambda tmp: sweep_file(tmp, '"train.batch_size" = [8]'),
        ),
    ),
    Case(
        "status-squeue-answers-a-web-page",
        ["sweep", "{tmp}/sw/sweep.toml", "--status", "--out", "{tmp}/sw"],
        2,
        r"squeue answered '<html>maintenance</html>', not lines of JOB_TASK\|STATE",
        alone=True,
        env={"PATH": "{tmp}/bin:" + os.environ["PATH"]},
        setup=combined(sweep_folder(executor="slurm"), slurm_tools(squeue="<html>maintenance</html>")),
    ),
    Case(
        "status-slurm-outcome-cut-short",
        ["sweep", "{tmp}/sw/sweep.toml", "--status", "--out", "{tmp}/sw"],
        0,
        env={"PATH": "{tmp}/bin:" + os.environ["PATH"]},
        says=r"a +failed .*its outcome cannot be read: .*a\.json line 1 is not JSON",
        setup=combined(
            sweep_folder(executor="slurm"),
            slurm_tools(),
            lambda tmp: ((tmp / "sw/slurm").mkdir(), (tmp / "sw/slurm/a.json").write_text('{"exit_code": 0')),
        ),
    ),
    Case(
        "fault-step-past-the-epoch",
        [*S, "--out", "{tmp}/r"],
        2,
        r"DDPLAB_FAULT='raise:epoch=1:step=9': step=9 would never fire: this run's epochs take at most 2 optimizer "
        r"steps$",
        alone=True,
        after=no_folder("r"),
        env={"DDPLAB_FAULT": "raise:epoch=1:step=9"},
    ),
    # a path with ~ is the home folder's, wherever a command takes a path (HOME is the test's folder here)
    Case(
        "tilde-report-out",
        ["report", "~/run", "--out", "~/rep"],
        0,
        env={"HOME": "{tmp}"},
        setup=lambda tmp: finished_run(tmp),
        after=tilde_expanded("rep/index.html"),
    ),
    Case(
        "tilde-sweep-file",
        ["sweep", "~/s.toml", "--out", "~/sw", "--dry-run"],
        0,
        env={"HOME": "{tmp}"},
        setup=lambda tmp: sweep_file(tmp, '"train.batch_size" = [8]'),
        after=tilde_expanded("s.toml"),
    ),
    # folder names that are not UTF-8 (Python holds their bytes as lone surrogates): shown as U+FFFD, never a crash
    Case(
        "report-non-utf8-folder",
        ["report", "{tmp}/bad\udcffdir", "--out", "{tmp}/rep"],
        0,
        setup=lambda tmp: finished_run(tmp / "bad\udcffdir", "run\udcfe"),
        after=shown_as_replacement("rep/index.html"),
    ),
    Case(
        "compare-non-utf8-folder",
        ["compare", "{tmp}/bad\udcffdir/run\udcfe", "{tmp}/bad\udcffdir/run\udcfe"],
        0,
        setup=lambda tmp: finished_run(tmp / "bad\udcffdir", "run\udcfe"),
    ),
    Case(
        "sweep-into-a-non-utf8-folder",
        ["sweep", "{tmp}/s.toml", "--out", "{tmp}/sw\udcff", "--no-estimate"],
        0,
        setup=lambda tmp: sweep_text(
            '[base.data]\ndataset = "synthetic"\nsynthetic_size = 64\nimage_size = 16\n'
            '[base.train]\ndevice = "cpu"\nepochs = 1\n[grid]\n"train.batch_size" = [32]\n'
        )(tmp),
        after=shown_as_replacement("sw\udcff/report/index.html", "sw\ufffd"),
        says=r"\[1/1\] batch-size-32: finished",
    ),  # TensorBoard's writer takes only UTF-8 paths: the run goes on without it
    Case(
        "tilde-compare",
        ["compare", "~/run", "~/run"],
        0,
        env={"HOME": "{tmp}"},
        setup=lambda tmp: finished_run(tmp),
        after=tilde_expanded("run/summary.json"),
    ),
    # not errors: nothing to do, and said so; stray launcher variables ignored, and said so
    Case(
        "sbatch-without-srun",
        [*S, "--out", "{tmp}/r"],
        0,
        env={"SLURM_PROCID": "0", "SLURM_NTASKS": "2"},
        note=r"ddplab: note: ignored SLURM_NTASKS=2: srun did not start this process",
    ),
    Case(
        "rank-without-master",
        [*S, "--out", "{tmp}/r"],
        0,
        env={"RANK": "0", "WORLD_SIZE": "2"},
        note=r"ddplab: note: ignored RANK, WORLD_SIZE: without MASTER_ADDR, MASTER_PORT",
    ),
    Case(
        "malformed-but-ignored",
        [*S, "--out", "{tmp}/r"],
        0,
        env={"RANK": "abc", "LOCAL_WORLD_SIZE": "abc"},
        note=r"ddplab: note: ignored RANK: without WORLD_SIZE, MASTER_ADDR, MASTER_PORT",
    ),
    Case(
        "report-skips-an-unreadable-run",
        ["report", "{tmp}", "--out", "{tmp}/rep"],
        0,
        setup=one_good_one_truncated,
        after=report_lists_the_unreadable_run,
    ),
    Case(
        "report-leaves-out-an-unreadable-env-json",
        ["report", "{tmp}", "--out", "{tmp}/rep"],
        0,
        setup=run_with_a_binary_env_json,
        after=report_draws_the_run_and_says_env_json_was_left_out,
    ),
    Case(
        "report-of-a-sweep-whose-manifest-is-a-folder",
        ["report", "{tmp}/sw", "--out", "{tmp}/rep"],
        3,
        r"sw/manifest\.json cannot be read \(IsADirectoryError\)",
        alone=True,
        setup=sweep_folder_whose_manifest_is_a_folder,
    ),
    Case(
        "resume-finished-run",
        ["train", "--out", "{tmp}/run", "--resume"],
        0,
        setup=resume_nothing_setup,
        after=resume_nothing_after,
    ),
    # a resumed run's config.toml is its record: empty, cut short, other-shaped or edited, it is refused naming the
    # file, and nothing in the folder changes (never filled in with defaults, never trained on under other settings)
    Case(
        "resume-empty-config",
        ["train", "--out", "{tmp}/run", "--resume", "--epochs", "3"],
        2,
        r"run/config\.toml is not the config\.toml ddplab wrote for this run \(it is empty\)",
        alone=True,
        setup=resume_empty_setup,
        after=resume_empty_after,
    ),
    Case(
        "resume-edited-config",
        ["train", "--out", "{tmp}/run", "--resume", "--epochs", "3"],
        2,
        r"run/config\.toml was edited after the run's last checkpoint \(optim\.lr: [\d.]+ in the checkpoint, 0\.5 in "
        r"the file\)",
        alone=True,
        setup=resume_edited_setup,
        after=resume_edited_after,
    ),
    # an empty value (`--out "$OUT"` with OUT unset) is refused wherever it is given, never read as the default
    Case(
        "empty-out-train",
        [*S, "--out", ""],
        2,
        r"output\.out='' is not valid: an empty value \(an unset shell variable\?\): leave the option out for its "
        r"default, or say none",
        alone=True,
    ),
    Case(
        "empty-out-sweep",
        ["sweep", "assignment", "--out", " ", "--dry-run"],
        2,
        r"argument --out: an empty path \(an unset shell variable\?\)",
        alone=True,
    ),  # fmt: skip
    Case("empty-out-report", ["report", "{tmp}", "--out", ""], 2, r"argument --out: an empty path", alone=True),
    Case("empty-link-plan", ["plan", "{tmp}", "--link", ""], 2, r"argument --link: an empty value", alone=True),
    Case(
        "empty-data-dir-eval", ["eval", "{tmp}", "--data-dir", ""], 2, r"argument --data-dir: an empty path", alone=True
    ),  # fmt: skip
    Case(
        "empty-setting-in-a-sweeps-set",
        ["sweep", "assignment", "--set", "output.mlflow=", "--dry-run"],
        2,
        r"output\.mlflow='' is not valid: an empty value",
        alone=True,
    ),
    # a worker count no machine can start (a typo's 10^11) is refused before anything is spawned
    Case(
        "ddp-workers-past-the-machine",
        [*S, "--strategy", "ddp", "--nproc", "99999999999", "--out", "{tmp}/r"],
        2,
        r"dist\.nproc=99999999999 is not valid: (this user may start at most \d+ processes \(ulimit -u\)|each "
        r"worker process holds about 200 MiB)",
        alone=True,
        after=no_folder("r"),
    ),
    Case(
        "kernels-device-not-a-device",
        ["kernels", "check", "--device", "nope"],
        2,
        r"argument --device: invalid choice: 'nope'",
        alone=True,
    ),  # fmt: skip
    Case(
        "plan-links-file-is-a-folder",
        ["plan", "{tmp}/run", "--link", "measured", "--links-file", "{tmp}"],
        2,
        r"--link measured reads .*, a folder, not a links file",
        alone=True,
        setup=finished_run,
    ),
    Case(
        "another-commands-flag-suggested-as-such",
        ["models", "--lnk", "2"],
        2,
        r"did you mean --link \(an option of ddplab plan and ddplab hosts up\)\?",
        alone=True,
    ),
    Case(
        "config-with-a-byte-order-mark",
        ["train", "--config", "{tmp}/bom.toml", *S[1:], "--out", "{tmp}/r"],
        0,
        setup=lambda tmp: (tmp / "bom.toml").write_bytes(b"\xef\xbb\xbf[optim]\nlr = 0.02\n"),
        after=lambda tmp: None if "lr = 0.02" in (tmp / "r" / "config.toml").read_text() else pytest.fail("lr"),
    ),
]


def ddplab(*args, env=None):
    return ddplab_cli(*args, env=env, errors="replace")  # a path of bytes that are not UTF-8 is printed as it is


ROWS_AT_ONCE = 2  # each row is a fresh Python, one core's work: two at a time halve the table's time on 2 cores


@dataclass
class Outcome:
    tmp: Path
    proc: subprocess.CompletedProcess
    left: list[int]  # processes of the row still alive once its command returned


def run_row(case: Case, tmp: Path) -> Outcome:
    marker = f"DDPLAB_TEST_{uuid.uuid4().hex}"
    env = {k: v.replace("{tmp}", str(tmp)) for k, v in (case.env or {}).items()}
    proc = ddplab(*[a.replace("{tmp}", str(tmp)) for a in case.args], env={marker: "1", **env})
    return Outcome(tmp, proc, leftover_processes(marker))


@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory) -> dict[str, Outcome]:
    """Every selected row set up (in order, here), then run as a user would, ROWS_AT_ONCE at a time."""
    from concurrent.futures import ThreadPoolExecutor

    SHARED.setdefault("factory", tmp_path_factory)
    selected = [
        item.callspec.params["case"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_error_contract" and hasattr(item, "callspec")
    ]
    folders = {}
    for case in selected:
        folders[case.id] = tmp_path_factory.mktemp(re.sub(r"[^\w-]", "_", case.id)[:40])
        if case.setup:
            case.setup(folders[case.id])
    with ThreadPoolExecutor(ROWS_AT_ONCE) as pool:
        running = {case.id: pool.submit(run_row, case, folders[case.id]) for case in selected}
        return {name: future.result() for name, future in running.items()}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_error_contract(case, outcomes):
    tmp, proc = outcomes[case.id].tmp, outcomes[case.id].proc
    assert proc.returncode == case.code, proc.stderr[-3000:]
    if case.code:
        errors = [line for line in proc.stderr.splitlines() if line.startswith("ddplab: error:")]
        assert len(errors) == 1 and errors[0] == proc.stderr.strip().splitlines()[-1], proc.stderr[-3000:]
        assert re.search(case.line, errors[0]), errors[0]
        assert "weights_only" not in errors[0]  # never advise unsafe loading
        assert not case.alone or proc.stderr.strip() == errors[0], proc.stderr[-3000:]
    assert ("Traceback" in proc.stderr) == case.debug, proc.stderr[-3000:]
    assert re.search(case.note, proc.stderr), proc.stderr[-3000:]
    assert re.search(case.says, proc.stdout), proc.stdout[-3000:]
    assert outcomes[case.id].left == []
    if case.after:
        case.after(tmp)


def test_resume_with_nothing_left_says_so(tmp_path, tmp_path_factory):
    SHARED.setdefault("factory", tmp_path_factory)
    finished_run(tmp_path)
    proc = ddplab("train", "--out", str(tmp_path / "run"), "--resume")
    assert proc.returncode == 0 and "nothing to do" in proc.stdout and "pass a larger --epochs" in proc.stdout


def test_a_reader_that_goes_away_stops_the_command_quietly():
    """`ddplab models | head -1`: the closed pipe ends the command with 141 (as SIGPIPE would), no error line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddplab", "models"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    proc.stdout.close()  # long before the interpreter has started, let alone written
    assert proc.wait(timeout=120) == 141
    assert proc.stderr.read() == ""


def test_two_runs_cannot_share_a_folder(tmp_path):
    """While one process tree holds a run folder, a second run there is refused with the owner named."""
    from ddplab.rundir.runlock import run_lock

    with run_lock(tmp_path / "r"):
        proc = ddplab(*S, "--out", str(tmp_path / "r"))
        assert proc.returncode == 2, proc.stderr
        line = proc.stderr.strip().splitlines()[-1]
        assert f"is in use by pid {os.getpid()}" in line and "choose another --out" in line
        assert sorted(p.name for p in (tmp_path / "r").iterdir()) == [".lock"]
    # The owner is gone: its lock is stale and the folder is usable.
    assert ddplab(*S, "--out", str(tmp_path / "r")).returncode == 0


def test_two_sweeps_cannot_share_a_folder(tmp_path):
    """A sweep holds its folder for as long as it runs: a second sweep there is refused, and runs nothing."""
    from ddplab.rundir.runlock import run_lock

    sweep_file(tmp_path, '"train.batch_size" = [8]')
    with run_lock(tmp_path / "out", "sweep"):
        proc = ddplab("sweep", str(tmp_path / "s.toml"), "--out", str(tmp_path / "out"))
        assert proc.returncode == 2, proc.stderr
        line = proc.stderr.strip().splitlines()[-1]
        assert (
            f"is in use by pid {os.getpid()}" in line and "wait for that sweep to end, or choose another --out" in line
        )
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".lock"]


def test_two_reports_cannot_write_one_folder_at_once(tmp_path, tmp_path_factory):
    """Two reports into one --out at once left one's page over the other's plots: the second is refused, naming
    the first, and writes nothing there."""
    from ddplab.rundir.runlock import run_lock

    SHARED.setdefault("factory", tmp_path_factory)
    run = finished_run(tmp_path)
    (tmp_path / "rep").mkdir()
    (tmp_path / "rep" / "index.html").write_text("the first report's")
    with run_lock(tmp_path / "rep", "report"):
        proc = ddplab("report", str(run), "--out", str(tmp_path / "rep"))
        assert proc.returncode == 2, proc.stderr
        line = proc.stderr.strip().splitlines()[-1]
        assert line.startswith(f"ddplab: error: the report folder '{tmp_path / 'rep'}' (--out) is in use by pid ")
        assert "wait for that report to end, or choose another --out" in line
        assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == [".lock", "index.html"]
    assert (tmp_path / "rep" / "index.html").read_text() == "the first report's"


def test_a_killed_owner_leaves_a_stale_lock_that_is_taken_over(tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from ddplab.rundir.runlock import run_lock\nwith run_lock(Path(sys.argv[1])):\n"
            "    print('held', flush=True); time.sleep(600)",
            str(tmp_path / "r"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "held"
    assert ddplab(*S, "--out", str(tmp_path / "r")).returncode == 2
    proc.kill()
    proc.wait()
    assert json.loads((tmp_path / "r" / ".lock").read_text())["pid"] == proc.pid  # left behind by SIGKILL
    assert ddplab(*S, "--out", str(tmp_path / "r")).returncode == 0
    assert not (tmp_path / "r" / ".lock").exists()


def test_a_full_disk_keeps_the_last_good_checkpoint_and_no_temp_file(tmp_path, monkeypatch, capsys):
    """torch.save reports ENOSPC as a RuntimeError mid-write: one line, exit 5, nothing half-written left."""
    from ddplab.cli import main
    from ddplab.rundir import checkpoint

    real_save = torch.save
    calls = []

    def save_until_full(obj, f, *args, **kwargs):
        calls.append(f)
        if len(calls) > 2:  # epoch 1's last.pt and best.pt are written; epoch 2 hits a full disk
            Path(f).write_bytes(b"partial")
            raise RuntimeError(
                "[enforce fail at inline_container.cc:603] . PytorchStreamWriter failed writing file "
                "data/0: file write failed"
            )
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_until_full)
    out = tmp_path / "r"
    assert main([*S, "--epochs", "3", "--out", str(out)]) == 5
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        line.startswith("ddplab: error: cannot write checkpoint")
        and "disk full" in line
        and "previous checkpoint is kept" in line
    )
    assert not list(out.rglob("*.tmp"))
    monkeypatch.setattr(torch, "save", real_save)
    assert checkpoint.load(out / "checkpoints" / "last.pt")["train_state"]["epoch"] == 1
    assert main(["train", "--out", str(out), "--resume"]) == 0  # and the run goes on from there


def ranks_started(marker: str) -> bool:
    """Whether a process of this test is an all-reduce rank (the elastic launcher's spawned worker)."""
    for pid in leftover_processes(marker):
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            pass
    return False


@pytest.mark.parametrize(
    "command",
    [
        ["plan", "--measure", "--nproc", "2", "--out", "{tmp}/links.json"],
        ["sweep", "{tmp}/s.toml", "--out", "{tmp}/out"],
    ],
    ids=["plan-measure", "sweep"],
)
def test_a_stop_signal_while_the_link_is_timed_ends_the_command_with_130(command, tmp_path):
    """SIGTERM once the ranks run: one line, exit 130, no process left, nothing written, and a sweep starts
    none of its runs (it measures the link first when it has a DDP point)."""
    import signal
    import time

    (tmp_path / "s.toml").write_text(
        '[base.data]\ndataset = "synthetic"\nsynthetic_size = 64\n[base.train]\n'
        'device = "cpu"\nepochs = 1\n[[variants]]\nlabel = "ddp"\n'
        '"dist.strategy" = "ddp"\n"dist.nproc" = 2\n'
    )
    marker = f"DDPLAB_TEST_{uuid.uuid4().hex}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddplab", *[a.replace("{tmp}", str(tmp_path)) for a in command]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", marker: "1"},
    )
    deadline = time.monotonic() + 120
    while not ranks_started(marker):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == (
        "ddplab: error: interrupted by SIGTERM while timing the all-reduce: nothing "
        "was written; run the command again to measure"
    )
    assert "Traceback" not in err and leftover_processes(marker) == []
    assert not (tmp_path / "links.json").exists() and not (tmp_path / "out" / "runs").exists()


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB file system (tmpfs; needs root), unmounted afterwards: a disk that fills up mid-command."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True
        ).returncode
        != 0
    ):
        tiers.skip("root", "mounting a small tmpfs needs root")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def whole(path: Path) -> bool:
    """A file as ddplab finishes it: a PNG up to its IEND chunk, JSON that parses, a page to its end."""
    data = path.read_bytes()
    if path.suffix == ".png":
        return data.endswith(b"IEND\xaeB`\x82")
    if path.suffix == ".json":
        return json.loads(data) is not None
    if path.suffix == ".html":
        return data.rstrip().endswith(b"</html>")
    return data.endswith(b"\n")


@pytest.mark.parametrize(
    "command, full",
    [
        (["report", "{sweep}", "--out", "{disk}/rep"], False),
        (["report", "{sweep}", "--out", "{disk}/rep"], True),  # the report folder's lock: a pwrite, no name in it
        (["plan", "{run}", "--link", "nvlink", "--out", "{disk}/p.json"], True),
    ],
    ids=["report", "report-on-a-full-disk", "plan"],
)
def test_a_disk_that_fills_up_leaves_whole_files_or_none(command, full, small_disk, tmp_path, tmp_path_factory):
    """Plots, pages, CSVs and plan.json on a full disk: exit 5, one line naming the file, no temporary file, and
    every file left is whole (PNGs too: each is written to a temporary file and renamed)."""
    SHARED.setdefault("factory", tmp_path_factory)
    sweep_folder()(tmp_path)
    if full:  # not a byte left (a report's pages alone outgrow 64 KiB)
        with pytest.raises(OSError), open(small_disk / "fill", "wb", buffering=0) as f:
            while True:
                f.write(b"\0" * 1024)
    args = [a.format(sweep=tmp_path / "sw", run=tmp_path / "sw" / "runs" / "a", disk=small_disk) for a in command]
    proc = ddplab(*args)
    assert proc.returncode == 5, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"ddplab: error: cannot (write|create the folder) {re.escape(str(small_disk))}/\S+: No space left "
        r"on device; free some space",
        line,
    ), line
    left = [p for p in small_disk.rglob("*") if p.is_file() and p.name != "fill"]
    assert not [p for p in left if ".tmp" in p.name or ".probe" in p.name], left
    assert all(whole(p) for p in left), [p for p in left if not whole(p)]
