#!/usr/bin/env python3
"""What the link costs: one host against two hosts with links of a set rate, same global batch.

    sudo DDPLAB_DATA=../shared/data/cifar10-jpeg python benchmarks/network.py --rates 100mbit,1gbit,none --repeats 2
    sudo python benchmarks/network.py --quick        # seconds, synthetic data: checks the script only

The hosts are network namespaces made by ddplab.launch.hosts (`ddplab hosts up 2 --link RATE`),
each with its own address; the rate shapes each host's link both ways (tc tbf). Sides:
- one host: `--batch-size B`, one process of one thread;
- one host beside its twin: the one-host run in each host at once (this test cluster's hosts share one VM's
  cores: what a step computes beside a second busy process, apart from any link);
- 2 hosts at RATE: `--nnodes 2 --nproc 1 --batch-size B/2`, one process of one thread on each,
  the rendezvous at host 0's address: the same global batch and images per epoch.
One thread per process, so that the two hosts' processes have a core each on a 2-core machine
and the one-host side is the same process as either of them. The sides alternate
(`--repeats` times each). Per run: training images/s after the first epoch, and the
all-reduce wait DDP's own timers put on each step. For each rate, `ddplab plan --measure`
across the two hosts gives the bus bandwidth the link carries, beside the rate that was set.
The scaling planner predicts each 2-host side from the one-host run and that measured link
(what `ddplab plan RUN --nodes 2 --gpus 1 --batch B/2 --inter-link measured` computes), with its
error band, and again from the twins' runs; the error is predicted / measured - 1 (issue 30's
validation across hosts).
Needs root (network namespaces).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import _common as common

from ddplab.launch import hosts, warm  # torch-free; _common puts src on the path
from ddplab.planner import model
from ddplab.planner.band import band_for
from ddplab.planner.links import load_links
from ddplab.report.figures import communication
from ddplab.rundir.runread import read_run

NAME = "network"
TWIN = "one host beside its twin"  # the one-host run in each host at once: the VM's cores as 2 hosts share them
# Each prediction of the 2 hosts is made from one of the one-host sides: alone (what `ddplab plan` is given) or
# beside its twin (the hosts of this test cluster share one VM's cores: a step computes slower beside a busy twin).
WAYS = {"from one host alone": "one host", "from one host beside its twin": TWIN}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_common_args(p, NAME, repeats=2)
    p.add_argument(
        "--rates", default="100mbit,1gbit,none", help="link rates to compare, comma-separated (none: unshaped)"
    )
    p.add_argument("--model", default="simple_cnn")
    p.add_argument("--subset", type=int, default=8192, help="train on the first N images")
    p.add_argument(
        "--test-subset",
        type=int,
        default=None,
        help="evaluate on the first N test images, and as many training images (default: as ddplab train does); "
        "the evaluation is outside the figures, only the wall time",
    )
    p.add_argument("--epochs", type=int, default=2, help="epochs per run; the first is left out of images/s")
    p.add_argument("--batch-size", type=int, default=128, help="global batch; each host takes half")
    p.add_argument(
        "--keep-runs", type=Path, default=None, help="keep the run folders here (default: a temporary folder)"
    )
    args = p.parse_args(argv)
    common.check_common_args(p, args)
    if args.device != "cpu":
        p.error("--device: the hosts share this machine's CPU; GPUs are not split between namespaces here")
    if args.quick:
        args.data_dir, args.subset, args.epochs, args.batch_size, args.repeats = None, 512, 2, 64, 1
        args.rates = args.rates if args.rates != "100mbit,1gbit,none" else "200mbit"
    try:
        args.rates = [hosts.parse_rate(r) for r in args.rates.split(",")]
    except hosts.HostsError as exc:
        p.error(str(exc))
    if args.batch_size % 2:
        p.error(f"--batch-size {args.batch_size} must split evenly over 2 hosts")
    reason = hosts.why_not_available()
    if reason:
        p.error(reason)
    return args


def train_flags(args) -> tuple[str, list[str]]:
    root = common.cifar_root(args.data_dir)
    if root is None:
        data, name = ["--dataset", "synthetic", "--data.synthetic_size", str(args.subset)], "synthetic"
        if args.quick:
            data += ["--data.image_size", "16", "--model.width", "0.5"]
    else:
        data, name = (
            ["--dataset", "cifar10", "--data-dir", str(root), "--data.download", "false", "--subset", str(args.subset)],
            "cifar10",
        )
    if args.test_subset is not None:
        data += ["--data.test_subset", str(args.test_subset), "--train.eval_train_images", str(args.test_subset)]
    return name, [
        *data,
        "--model",
        args.model,
        "--epochs",
        str(args.epochs),
        "--device",
        "cpu",
        "--train.threads",
        "1",
        "--output.progress",
        "false",
        "--output.tensorboard",
        "false",
    ]


def run_on_hosts(
    cluster: hosts.Cluster, command: list[str], logs: Path, per_host: list[list[str]] | None = None
) -> None:
    """The same command in every host of `cluster`, at once (host i's with `per_host[i]` after it); raises with the
    logs' tails if any fails."""
    env = common.child_env(1)
    procs = []
    for i in range(cluster.hosts):
        log = open(logs.with_name(f"{logs.name}-host{i}.log"), "w")
        argv = [*cluster.exec_prefix(i), *command, *(per_host[i] if per_host else [])]
        # Forked warm into the host where this process may (ddplab.launch.warm): the runs' figures are their epochs'.
        proc = warm.popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=common.REPO) or subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=common.REPO
        )
        procs.append((proc, log))
    failed = []
    for i, (proc, log) in enumerate(procs):
        code = proc.wait(timeout=3600)
        log.close()
        if code:
            failed.append(f"host {i} exit {code}: {Path(log.name).read_text()[-1500:]}")
    if failed:
        raise RuntimeError("\n".join(failed))


def measure_run(run_dir: Path) -> dict:
    run = common.read_run(run_dir)
    metrics, summary = run["metrics"], run["summary"]
    keep = metrics[1:] or metrics
    train_s = sum(r.train_s for r in keep)
    comm = communication(keep, summary["batch"]["global"], train_s)  # as the report reads it
    return {
        "world_size": summary["run"]["world_size"],
        "batch_local": summary["batch"]["local"],
        "images_per_s": sum(r.train_samples for r in keep) / train_s,
        "median_epoch_s": common.median([r.epoch_s for r in keep]),
        "ddp_exposed_ms": comm["ddp_exposed_ms"],
        "allreduce_share": comm["allreduce_share"],
        "test_acc": summary["final"]["test_acc"],
        "train_samples": [r.train_samples for r in metrics],
    }


def predict_two_hosts(one_host_run: Path, local_batch: int, link) -> float:
    """The planner's training images/s for 2 hosts x 1 process at `local_batch`, from a one-host run."""
    run = read_run(one_host_run)
    costs = model.step_costs(run.summary, run.history, run.config, run.steps)
    return model.predict_one(costs, 1, 2, local_batch, link, link).images_per_s


def main(argv=None) -> int:
    args = parse_args(argv)
    machine = common.machine_info("cpu")
    dataset, flags = train_flags(args)
    sides = ["one host", TWIN, *(f"2 hosts at {hosts.rate_text(r)}" for r in args.rates)]
    rate_of = dict(zip(sides[2:], args.rates, strict=False))
    runs: dict[str, list] = {side: [] for side in sides}
    links: dict[str, dict] = {}
    fitted: dict[str, Any] = {}  # each rate's measured link, for the planner
    one_host_dirs: dict[str, list[Path]] = {"one host": [], TWIN: []}
    predicted: dict[str, dict[str, float]] = {way: {} for way in WAYS}
    with tempfile.TemporaryDirectory() as tmp:
        base = args.keep_runs or Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        with hosts.cluster(2) as cluster:
            for side in sides[2:]:  # the link first: its own measurement, at this rate
                hosts.reshape(cluster.name, rate_of[side])
                print(f"measuring the link: {side} ...", file=sys.stderr, flush=True)
                out = base / f"links-{hosts.rate_text(rate_of[side])}.json"
                run_on_hosts(
                    cluster,
                    [
                        sys.executable,
                        "-m",
                        "ddplab",
                        "plan",
                        "--measure",
                        "--nproc",
                        "1",
                        "--nnodes",
                        "2",
                        "--rdzv-endpoint",
                        cluster.endpoint(29400),
                        "--max-mib",
                        "4" if args.quick else "16",
                        "--timeout-s",
                        "120",
                        "--out",
                        str(out),
                    ],
                    base / out.stem,
                )
                fitted[side] = load_links(out)
                link = fitted[side].links[0]
                links[side] = {
                    "set_bit_s": rate_of[side],
                    "busbw_gbps": link.busbw_gbps,
                    "alpha_ms": link.alpha_s * 1e3,
                    "fit_error_median": link.fit_error["median"],
                }
            for repeat, side in common.interleaved(args.repeats, sides):
                print(f"repeat {repeat + 1}/{args.repeats}: {side} ...", file=sys.stderr, flush=True)
                run_dir = base / f"{side.replace(' ', '-')}-{repeat + 1}"
                if side == "one host":
                    one_host_dirs[side].append(run_dir)
                    common.run_ddplab([*flags, "--batch-size", str(args.batch_size)], run_dir, env=common.child_env(1))
                elif side == TWIN:  # the one-host run on each host at once: each beside the other, as 2 hosts run
                    twins = [run_dir.with_name(f"{run_dir.name}-host{i}") for i in range(cluster.hosts)]
                    one_host = [sys.executable, "-m", "ddplab", "train", *flags, "--batch-size", str(args.batch_size)]
                    run_on_hosts(cluster, one_host, run_dir, [["--out", str(d)] for d in twins])
                    one_host_dirs[side] += twins
                    runs[side] += [{"repeat": repeat + 1, **measure_run(d)} for d in twins]
                    continue
                else:
                    hosts.reshape(cluster.name, rate_of[side])
                    run_on_hosts(
                        cluster,
                        [
                            sys.executable,
                            "-m",
                            "ddplab",
                            "train",
                            *flags,
                            "--batch-size",
                            str(args.batch_size // 2),
                            "--strategy",
                            "ddp",
                            "--nproc",
                            "1",
                            "--nnodes",
                            "2",
                            "--rdzv-endpoint",
                            cluster.endpoint(29500 + repeat),
                            "--dist.timeout_s",
                            "300",
                            "--out",
                            str(run_dir),
                        ],
                        run_dir,
                    )
                runs[side].append({"repeat": repeat + 1, **measure_run(run_dir)})
        for side in sides[2:]:  # from each one-host run, as `ddplab plan` would: the median prediction
            for way, baseline in WAYS.items():
                predicted[way][side] = common.median(
                    [predict_two_hosts(d, args.batch_size // 2, fitted[side]) for d in one_host_dirs[baseline]]
                )
    band = band_for(on_cuda=False, nodes=2)
    measured = {side: common.median([r["images_per_s"] for r in runs[side]]) for side in sides}
    one = measured["one host"]
    rows = []
    for side in sides:
        rate = measured[side]
        comm = [r["ddp_exposed_ms"] for r in runs[side] if r["ddp_exposed_ms"] is not None]
        link = links.get(side)
        guesses = [predicted[way].get(side) for way in WAYS]
        rows.append(
            [
                side,
                f"{runs[side][0]['batch_local']}/{args.batch_size}",
                common.fmt_rate(rate),
                common.fmt_list([r["images_per_s"] for r in runs[side]], 0),
                f"{rate / one:.2f}x",
                f"{common.median(comm):,.1f}" if comm else "-",
                f"{link['busbw_gbps'] * 8e3:,.0f} Mbit/s" if link else "-",
                f"{link['alpha_ms']:.2f}" if link else "-",
                *(f"{common.fmt_rate(g)} ({g / rate - 1:+.0%})" if g else "-" for g in guesses),
                " - ".join(map(common.fmt_rate, band.around(guesses[0]))) if guesses[0] else "-",
            ]
        )
    n_images = runs["one host"][0]["train_samples"][0]
    head = (
        f"{args.model}, {n_images:,} {dataset} training images, global batch {args.batch_size}, {args.epochs} epochs "
        f"per run (images/s after the first), {args.repeats} repeat(s) per side, alternating; one thread per process"
    )
    table = "\n".join(
        [
            head,
            "",
            common.markdown_table(
                [
                    "side",
                    "batch local/global",
                    "train images/s (median)",
                    "per repeat",
                    "vs one host",
                    "all-reduce wait ms/step (DDP, least-waiting rank)",
                    "link measured (plan --measure)",
                    "alpha ms",
                    *(f"predicted: {way} (error)" for way in WAYS),
                    "band around the first (planner/band.py)",
                ],
                rows,
            ),
        ]
    )
    errors = {way: {side: got[side] / measured[side] - 1 for side in got} for way, got in predicted.items()}
    alone = errors["from one host alone"]
    notes = [
        "\nThe link's rate is set with tc tbf on both ends of each host's veth; 'none' is veth unshaped. "
        "The measured bandwidth is ddplab plan --measure's fitted bus bandwidth across the two hosts. "
        "The predictions are made from the one-host run alone (as ddplab plan is given it) or beside its twin (the "
        "same run in the other host at once: the VM's cores as the 2 hosts share them). The planner's error from "
        f"one host alone: median |error| {common.median([abs(e) for e in alone.values()]):.0%}, worst "
        f"{max(abs(e) for e in alone.values()):.0%} over {len(alone)} rates; its band: {band.text()}."
    ]
    common.finish(
        NAME,
        args,
        machine,
        {
            "dataset": dataset,
            "runs": runs,
            "links": links,
            "speedup": {side: measured[side] / one for side in sides},
            "predicted_images_per_s": predicted,
            "error": errors,
        },
        table,
        notes,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
