"""A sweep with known numbers, its report, and the check that findings restate the tables, for the report's tests."""

import csv
import json
import re
from pathlib import Path

import tomli_w

from ddplab.config import tomllib  # tomli on Python 3.10

from support.runs import write_manifest, write_run


def write_sweep(root: Path) -> Path:
    """1 worker vs DDP x2, two seeds each, plus one failed run: epoch times 10 s and 6.25 s after the first."""
    sweep = root / "sweep"
    entries = []
    for workers, seed, acc in (("1", 0, 0.70), ("1", 1, 0.72), ("2", 0, 0.69), ("2", 1, 0.69)):
        name = f"w{workers}-s{seed}"
        if workers == "1":
            write_run(sweep / "runs" / name, seed=seed, test_acc=acc, steps=True, gpu=seed == 0)
        else:
            write_run(
                sweep / "runs" / name,
                seed=seed,
                strategy="ddp",
                nproc=2,
                test_acc=acc,
                epoch_s=(8.0, 6.25, 6.25),
                test_loss=(1.0, 0.9, 0.85),
                comm_share=0.1,
                peak_mib=450.0,
            )
        entries.append(
            {
                "name": name,
                "dir": f"runs/{name}",
                "point": {"workers": workers},
                "seed": seed,
                "status": "finished",
                "exit_code": 0,
                "error": None,
                "wall_s": 40.0,
            }
        )
    entries.append(
        {
            "name": "w4-s0",
            "dir": "runs/w4-s0",
            "point": {"workers": "4"},
            "seed": 0,
            "status": "failed",
            "exit_code": 4,
            "error": "training diverged: loss is nan at epoch 2",
            "wall_s": 3.0,
        }
    )
    manifest = {
        "version": 1,
        "name": "scaling",
        "description": "",
        "sweep_file": "scaling.toml",
        "axes": ["workers"],
        "repeats": 2,
        "runs": entries,
    }
    (sweep / "manifest.json").write_text(json.dumps(manifest))
    return sweep


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def numbers(text: str) -> list[str]:
    return re.findall(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?", text)


def section_text(section: dict) -> str:
    cells = [c for _, _, (headers, rows) in section["tables"] for c in [*headers, *(x for r in rows for x in r)]]
    return " ".join([section["setup"], *cells])


def assert_findings_restate_tables(result: dict) -> None:
    """Every number a finding gives is one the section's tables (or its setup line) give, as written there
    (what it says of points not measured is the machine's reason, not a figure)."""
    for section in result["sections"]:
        shown = section_text(section)
        for finding in [section["headline"], *section["findings"]]:  # the one-sentence answer too
            measured = re.sub(r"not measured (here|on this machine): .*", "", finding)
            for number in numbers(measured):
                assert number in shown, f"{number!r} of {finding!r} is in no table of {section['title']!r}"


def write_axis_sweep(sweep: Path, axis: str, variants: list[tuple[str, dict, dict]], version=1, sections=None) -> Path:
    """A finished one-axis sweep: per variant (label, config sections to update, write_run keywords)."""
    runs = []
    for label, sections_, run_kwargs in variants:
        run = write_run(sweep / "runs" / label, **run_kwargs)
        config = tomllib.loads((run / "config.toml").read_text())
        for section, values in sections_.items():
            config.setdefault(section, {}).update(values)
        (run / "config.toml").write_text(tomli_w.dumps(config))
        runs.append({"name": label, "point": {axis: label}, "seed": 0})
    return write_manifest(sweep, runs, axes=[axis], sections=sections, name=sweep.name, version=version)
