#!/usr/bin/env python3
"""The scaling model (`ddplab plan`) against measured DDP runs on this machine: the error of each point.

    DDPLAB_DATA=../shared/data/cifar10-jpeg python benchmarks/plan_validation.py          # minutes on 2 cores
    python benchmarks/plan_validation.py --quick                # synthetic data only: checks the script

Measures this machine's all-reduce with 2 and with 4 ranks (`ddplab plan --measure --nproc N`:
four ranks on two cores wait on each other far longer), then for each case and
local batch trains one process and DDP runs of 2 and 4 Gloo workers on the same cores
(threads split as ddplab splits them), and predicts the workers' training throughput from
the 1-process run (`planner.model`). Two cases: CIFAR-10 (a 4,000-image subset, simple_cnn at
half width, the batch_workers sweep's CPU profile) and a net so small at 16 px that the
all-reduce weighs on every step. Prints a Markdown table (measured, predicted, error) and
the median and worst absolute error; --out writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import REPO, child_env, describe_machine, machine_info, read_metrics, run_ddplab

from ddplab.launch import process
from ddplab.planner import model
from ddplab.planner.links import load_links
from ddplab.rundir.runread import read_run

CASES = {
    "cifar": [
        "--dataset",
        "cifar10",
        "--data.subset",
        "4000",
        "--model.width",
        "0.5",
        "--data.crop_padding",
        "0",
        "--data.flip",
        "false",
        "--epochs",
        "3",
    ],
    "tiny": [
        "--dataset",
        "synthetic",
        "--data.synthetic_size",
        "8192",
        "--data.image_size",
        "16",
        "--model.width",
        "0.25",
        "--epochs",
        "3",
    ],
}


def train(out: Path, case: str, batch: int, workers: int) -> Path:
    run_ddplab(
        [
            *CASES[case],
            "--batch-size",
            str(batch),
            "--device",
            "cpu",
            "--strategy",
            "ddp" if workers > 1 else "single",
            "--nproc",
            str(workers),
            "--backend",
            "gloo",
        ],
        out,
        env=child_env(),
    )
    return out


def throughput(run: Path) -> float:
    timed = read_metrics(run)[1:]
    return sum(r.train_samples for r in timed) / sum(r.train_s for r in timed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="cifar,tiny")
    parser.add_argument("--batches", default="16,32,128")
    parser.add_argument("--workers", default="2,4")
    parser.add_argument("--quick", action="store_true", help="the tiny case at batch 32 and 2 workers only")
    parser.add_argument("--out", type=Path, help="write the rows and links as JSON here")
    parser.add_argument("--runs", type=Path, help="keep the run folders here (to plan again); default: a temp folder")
    args = parser.parse_args()
    cases = ["tiny"] if args.quick else args.cases.split(",")
    batches = [32] if args.quick else [int(b) for b in args.batches.split(",")]
    workers = [2] if args.quick else [int(w) for w in args.workers.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = args.runs or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        links = root / "links.json"  # one fit per worker count: 4 ranks on 2 cores wait on each other far longer
        subprocess.run(
            process.ddplab_command(
                "plan", "--measure", "--nproc", ",".join(map(str, workers)), "--max-mib", "16", "--out", str(links)
            ),
            check=True,
            capture_output=True,
            cwd=REPO,
            env=child_env(),
        )
        link = load_links(links)
        for case in cases:
            for batch in batches:
                one = train(root / f"{case}-{batch}-1", case, batch, 1)
                run = read_run(one)
                costs = model.step_costs(run.summary, run.history, run.config, run.steps)
                for n in workers:
                    measured = throughput(train(root / f"{case}-{batch}-{n}", case, batch, n))
                    predicted = model.predict_one(costs, n, 1, batch, link).images_per_s
                    rows.append(
                        {
                            "case": case,
                            "batch": batch,
                            "workers": n,
                            "one": throughput(one),
                            "measured": measured,
                            "predicted": predicted,
                            "error": predicted / measured - 1,
                        }
                    )
                    print(
                        f"{case} batch {batch} x{n}: measured {measured:,.0f}, predicted {predicted:,.0f} "
                        f"({rows[-1]['error']:+.0%})",
                        file=sys.stderr,
                    )
    print(
        f"{describe_machine(machine_info('cpu'))}; links measured: "
        + ", ".join(f"{k.ranks} ranks {k.busbw_gbps:.2f} GB/s, alpha {k.alpha_s * 1e3:.2f} ms" for k in link.links)
        + "\n"
    )
    print("| case | local batch | 1 process, measured | workers | predicted | measured | error |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['case']} | {r['batch']} | {r['one']:,.0f} img/s | {r['workers']} | {r['predicted']:,.0f} | "
            f"{r['measured']:,.0f} | {r['error']:+.0%} |"
        )
    errors = [abs(r["error"]) for r in rows]
    print(f"\nmedian absolute error {statistics.median(errors):.0%}, worst {max(errors):.0%} over {len(rows)} points")
    if args.out:
        args.out.write_text(
            json.dumps({"rows": rows, "links": {k.ranks: [k.busbw_gbps, k.alpha_s] for k in link.links}}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
