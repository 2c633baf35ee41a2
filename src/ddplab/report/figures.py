"""The report's numbers: one row per run, one per point (mean and std over seeds), curves, scaling.

Every figure the report, `ddplab compare` and the findings use is computed here, once.

Times are steady-state: throughput, epoch time and time shares leave out the first epoch,
which still warms caches. Speed is *training throughput* (training images per second of
training time), so that evaluation, which the settings compared do not change, does not
dilute it. Speedup is a point's throughput over its baseline's; efficiency is speedup over
the ideal, the number of devices it adds: GPUs on CUDA, nodes on a CPU (processes on one
node share its cores, so their ideal is 1x: what they gain or lose is how well they use
the same cores).
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any, cast

from ddplab.errors import DataError
from ddplab.metrics.stragglers import named
from ddplab.report import noise
from ddplab.report.records import MEASURED, SETTINGS, TEXT, Gap, Overfit, Row, figure, setting
from ddplab.report.runs import Point
from ddplab.rundir.epochs import (
    PHASES,
    EpochRecord,
    gap_train_acc,
    optimizer_steps,
    timed_epochs,  # the file format's rules, torch-free
    training_rate,
)
from ddplab.rundir.runread import Run, displayable
from ddplab.topology import devices_brought, resolve_backend  # torch-free

if TYPE_CHECKING:
    from ddplab.rundir.summary import Summary

# A DDP run's communication per step, measured two ways (milliseconds): ddplab's probe of the all-reduce
# wait (the step timed with and without gradient sync, ranks lined up), and DDP's own timers on its
# sampled steps, on the rank that waited least (its exposed all-reduce: from backward's end to the last
# bucket's end; its span: from the first bucket's launch), and rank 0's wait for the slowest rank.
COMM_MS = ("probe_comm_ms", "ddp_exposed_ms", "ddp_comm_ms", "straggler_ms")
SHARES = tuple(p.removesuffix("_s") + "_share" for p in PHASES)
MEMORY_LABELS = ("peak_alloc_mib", "peak_rss_mib", "peak_reserved_mib")  # first found is reported


OVERFIT_RISE = 0.10  # test loss this far above its minimum at the end counts as overfitting
EARLY_STOP_PATIENCE = 2  # epochs without a lower test loss before early stopping would stop (seed report D's)


# ---- per run -----------------------------------------------------------------------------
def run_row(run: Run, point: str = "") -> Row:
    """The figures of one run; a run that did not finish keeps only its status and error."""
    row: Row = {
        "run": run.name,
        "point": point,
        "seed": run.seed,
        "status": run.status,
        "error": run.error or "",
        "dir": displayable(str(run.dir)),
    }
    if not run.finished:
        return row
    try:
        return {**row, **run_figures(run)}
    except (KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError, IndexError) as exc:
        raise DataError(
            f"{run.dir}: summary.json / metrics.jsonl lack a field ddplab writes ({exc!r}); "
            "written by another version, or edited?"
        ) from None


def run_figures(run: Run) -> Row:
    s, history = run.summary, run.history
    assert s is not None  # run_row passes finished runs only
    steady = timed_epochs(history)
    train_s = sum(r.train_s for r in steady)
    label, peak = peak_memory(s)
    final, last = s["final"], history[-1]
    gap_train, gap_from = gap_train_acc(last)
    low = min(history, key=lambda r: r.test_loss)
    load = noise.run_load(history, shared_device=bool(s["run"].get("shared_device")))
    rates = noise.window_rates(run.steps, s["batch"]["global"], len(history))
    return {
        "strategy": s["run"]["strategy"],
        "device": s["run"]["device"],
        "precision": s["run"]["precision"],
        "device_name": run.env.get("device_name") or s["run"]["device"],
        "torch": run.env.get("torch") or "?",
        "straggler": straggler(s),
        "slowest": slowest(s),
        "backend": s["run"].get("backend")
        or backend(s["run"]["strategy"], run.config.get("dist.backend", "auto"), s["run"]["device"]),
        "memory_label": label,
        "world_size": workers_text(s) if s.get("membership") else world_size(s),  # a resized run: no scaling point
        "nodes": run.config.get("dist.nnodes", 1),
        "link": link_text(run.env.get("network")),
        "local_batch": s["batch"]["local"],
        "global_batch": s["batch"]["global"],
        "accumulate": s["batch"].get("accumulate", 1),
        "train_images": s.get("data", {}).get("train_images"),
        "test_images": s.get("data", {}).get("eval_images"),
        "epochs": len(history),
        "final_test_acc": final["test_acc"],
        "best_test_acc": s["best"]["test_acc"],
        "final_train_acc": final["train_acc"],
        "train_eval_acc": last.train_eval_acc,
        "acc_gap": difference(gap_train, final["test_acc"]),
        "gap_basis": "eval mode" if gap_from == "train_eval_acc" else "running, augmented",
        "final_test_loss": final["test_loss"],
        "min_test_loss": low.test_loss,
        "min_test_loss_epoch": low.epoch,
        "total_s": s["time"]["total_s"],
        "train_s": s["time"]["train_s"],
        "eval_s": s["time"].get("eval_s"),
        "epoch_s": statistics.fmean(r.epoch_s for r in steady) if steady else None,
        "images_per_s": training_rate(history),
        "within_noise": noise.within_run_noise(rates),
        "load": load,
        "other_cpu": load.other_cpu,
        "cores_busy": cores_busy(steady, train_s),
        "peak_mib": peak,
        **cast(  # SHARES
            Row,
            {
                share: sum(r.metric(phase) or 0.0 for r in steady) / train_s
                if train_s and steady[-1].metric(phase) is not None
                else None
                for phase, share in zip(PHASES, SHARES, strict=True)
            },
        ),
        **communication(steady, s["batch"]["global"], train_s),
    }


def communication(steady: list[EpochRecord], global_batch: int, train_s: float) -> Row:
    """COMM_MS of a run, and the shares of its training time rank 0 spent on the all-reduce (DDP's exposed
    all-reduce on the rank that waited least) and waiting for the slowest rank; None where not measured
    (one process, no time breakdown, a torch whose DDP keeps no timings). DDP's figures are each epoch's
    means over the steps it timed: averaged here over the epochs that have them all."""
    out: Row = {
        "probe_comm_ms": None,  # COMM_MS
        "ddp_exposed_ms": None,
        "ddp_comm_ms": None,
        "straggler_ms": None,
        "straggler_share": None,
        "allreduce_share": None,
    }
    steps = optimizer_steps(steady, global_batch)
    if not steady or not steps or steady[-1].comm_wait_s is None:
        return out
    out["probe_comm_ms"] = 1000 * sum(r.comm_wait_s or 0.0 for r in steady) / steps
    timed: list[tuple[list[Any], list[Any]]] = [  # None-free: the condition keeps whole rows only
        (r.per_rank["ddp_comm_s"], r.per_rank["ddp_overlap_s"])
        for r in steady
        if all(None not in (r.per_rank.get(k) or [None]) for k in ("ddp_comm_s", "ddp_overlap_s"))
    ]
    ranks = len(timed[-1][0]) if timed else 0
    timed = [(c, o) for c, o in timed if len(c) == len(o) == ranks]
    if ranks < 2 or not timed:
        return out
    comm = [statistics.fmean(c[i] for c, _ in timed) for i in range(ranks)]
    exposed = [statistics.fmean(c[i] - o[i] for c, o in timed) for i in range(ranks)]
    least = min(range(ranks), key=exposed.__getitem__)
    wait = exposed[0] - exposed[least]
    out.update(
        {
            "ddp_exposed_ms": 1000 * exposed[least],
            "ddp_comm_ms": 1000 * comm[least],
            "straggler_ms": 1000 * wait,
            "straggler_share": wait * steps / train_s if train_s else None,
            "allreduce_share": exposed[least] * steps / train_s if train_s else None,
        }
    )
    return out


def link_text(link: dict | None) -> str | None:
    """'eth0, shaped to 100 Mbit/s' / 'eth0, 10,000 Mbit/s' / 'eth0' for a run's env.json network entry."""
    if not isinstance(link, dict) or not isinstance(link.get("interface"), str):
        return None
    for key, words in (("shaped_mbit", "shaped to "), ("speed_mbit", "")):
        value = link.get(key)
        if isinstance(value, (int, float)) and value > 0:
            return f"{link['interface']}, {words}{value:,.0f} Mbit/s"
    return link["interface"]


def cores_busy(epochs: list[EpochRecord], train_s: float) -> float | None:
    """CPU cores the run's processes kept busy while training (their CPU seconds over the wall time)."""
    cpu = [sum(v for v in r.per_rank["cpu_s"] if v is not None) for r in epochs if "cpu_s" in r.per_rank]
    return sum(cpu) / train_s if cpu and len(cpu) == len(epochs) and train_s else None


def world_size(summary: Summary) -> int:
    """Workers: processes under DDP, GPUs under DataParallel (one process driving several)."""
    gpus = summary.get("gpu_peak_alloc_mib")
    if summary["run"]["strategy"] == "dp" and isinstance(gpus, list) and gpus:
        return len(gpus)
    return summary["run"]["world_size"]


def workers_text(summary: Summary) -> str:
    """The workers of a run whose membership changed, stretch by stretch ("3 then 2 then 3"): text where a count
    would be, so that no speedup or efficiency takes the run as if it had kept one number of workers."""
    return " then ".join(str(segment["workers"]) for segment in summary.get("membership", []))


def straggler(summary: Summary) -> str | None:
    """The run's chronic straggler as the findings say it ("rank 3 on 10.211.0.2, chronically 14% slower"), from
    summary.json's `stragglers` (metrics/stragglers.py); None where none was named or measured."""
    found = cast(dict[str, Any], summary.get("stragglers") or {}).get("straggler")
    if not isinstance(found, dict):
        return None
    who = named(found.get("ranks") or [], found.get("host"), on="on host")
    return f"{who}, chronically {found.get('slower', 0):.0%} slower"


def slowest(summary: Summary) -> str | None:
    """The rank that joined the all-reduce last in the most steps, with that share ("1 (97%)"): who was slowest,
    chronic or not; None with one rank, or before the step clocks."""
    shares = cast(dict[str, Any], summary.get("stragglers") or {}).get("last_share") or []
    if len(shares) < 2 or not all(isinstance(v, (int, float)) for v in shares):
        return None
    rank = max(range(len(shares)), key=shares.__getitem__)
    return f"{rank} ({shares[rank]:.0%})"


def backend(strategy: str, requested: str, device: str) -> str:
    """The collective backend of a run folder written before summaries recorded it ("auto" resolved as
    ddplab resolved it then); none without DDP."""
    if strategy != "ddp":
        return "none"
    return resolve_backend(requested, on_cuda=str(device).startswith("cuda"))


def peak_memory(summary: Summary) -> tuple[str | None, float | None]:
    """The largest per-rank peak, named by what it measures (allocated on CUDA, RSS on CPU)."""
    ranks, memory = summary.get("ranks") or {}, summary.get("memory") or {}
    for label in MEMORY_LABELS:
        if isinstance(ranks.get(label), dict) and ranks[label].get("max") is not None:
            return label, ranks[label]["max"]
    for label in MEMORY_LABELS:
        if memory.get(label) is not None:
            return label, memory[label]
    return None, None


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, None where either is not measured (or b is 0)."""
    return None if a is None or not b else a / b


def difference(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


# ---- per point ---------------------------------------------------------------------------
def mean_std(values: list[Any]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation of the values given; std is None below two values."""
    xs = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not xs:
        return None, None
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else None


def point_rows(points: list[Point], run_rows: dict[str, Row]) -> list[Row]:
    """One row per point: settings, every measured figure as `name` (mean) and `name_std`, the timing
    with its noise, and the worst load any of its runs saw."""
    rows = []
    for p in points:
        members = [run_rows[r.name] for r in p.runs]
        row: Row = {
            "point": p.label,
            "axes": dict(p.axes),
            "seeds": len(members),
            "runs": " ".join(r.name for r in p.runs),
        }
        named = cast(dict[str, Any], row)  # the names of TEXT, SETTINGS and MEASURED are Row's (a test keeps them so)
        for key in (*TEXT, *SETTINGS):
            values = list(dict.fromkeys(figure(m, key) for m in members))
            named[key] = values[0] if len(values) == 1 else "mixed"
        for key in MEASURED:
            named[key], named[f"{key}_std"] = mean_std([figure(m, key) for m in members])
        row["timing"] = noise.point_timing(
            [m.get("images_per_s") for m in members], [m.get("within_noise") for m in members]
        )
        row["images_per_s_noise"] = row["timing"].noise if row["timing"] else None
        row["load"] = noise.combine_loads([m["load"] for m in members])
        row["loads"] = {m["run"]: m["load"] for m in members}
        row["other_cpu"] = row["load"].other_cpu
        rows.append(row)
    return rows


def fewest_workers(rows: list[Row]) -> Row | None:
    """The timed row with the fewest workers, a single-process one first; None when no row was timed."""
    timed = [r for r in rows if r.get("images_per_s") and isinstance(r.get("world_size"), int)]
    if not timed:
        return None
    least = [r for r in timed if r["world_size"] == min(setting(t, "world_size") or 0 for t in timed)]
    return next((r for r in least if r["strategy"] == "single"), least[0])


def devices(row: Row) -> int:
    """The hardware a row's workers bring (topology.devices_brought)."""
    return devices_brought(
        setting(row, "world_size") or 1,
        setting(row, "nodes") or 1,
        on_cuda=str(row.get("device", "")).startswith("cuda"),
    )


def speedup(row: Row, base: Row) -> float | None:
    """The one definition of speedup, for the report's sections and `ddplab compare`: this row's training
    throughput over the baseline's (epochs after the first); None unless both were timed."""
    mine, theirs = row.get("images_per_s"), base.get("images_per_s")
    return mine / theirs if mine and theirs else None


def ideal_speedup(row: Row, base: Row) -> float:
    """What perfect scaling would give: the devices this row has over the baseline's."""
    return devices(row) / devices(base)


def scale(rows: list[Row], base: Row | None, name: str) -> None:
    """Speedup and efficiency (speedup over the ideal) of each row against `base`, for `ddplab compare`.
    `baseline` names the row compared against, by its `name` field; the baseline itself gets none
    (it is 1x by definition)."""
    for row in rows:
        fast = (
            base is not None
            and row is not base
            and speedup(row, base) is not None
            and isinstance(row.get("world_size"), int)
        )
        row["speedup"] = speedup(row, base) if fast and base is not None else None
        row["ideal"] = ideal_speedup(row, base) if fast and base is not None else None
        row["efficiency"] = ratio(row["speedup"], row["ideal"])
        row["baseline"] = figure(base, name) if fast and base is not None else None
        row["is_baseline"] = base is not None and row is base


def train_epoch_s(row: Row) -> float | None:
    """A row's training epoch (epochs after the first): its training images over its throughput."""
    return ratio(setting(row, "train_images") or None, row.get("images_per_s"))


def scaling_gap(row: Row, base: Row, ideal: float) -> Gap | None:
    """Where a multi-worker point's training epoch loses to the ideal (the baseline's epoch over `ideal`),
    in seconds an epoch by cause: compute (forward+backward less the waits below), the all-reduce wait
    (DDP's timers where it kept them, as they time every step on a CPU; else ddplab's probe), the wait
    for a straggling rank (rank 0's, from DDP's timers; None where not measured, and then inside
    compute), optimizer, data, and the rest of the step. None unless both sides have a
    time breakdown and the point is slower than ideal."""
    shares = ("forward_backward_share", "comm_wait_share", "optimizer_share", "data_share")
    if not (row.get("images_per_s") and base.get("images_per_s") and row.get("train_images") and ideal) or any(
        not isinstance(side.get(key), (int, float)) for side in (row, base) for key in shares
    ):
        return None
    epoch, base_epoch = train_epoch_s(row), train_epoch_s(base)
    if epoch is None or base_epoch is None:  # a baseline without train_images
        return None
    target = base_epoch / ideal
    if epoch <= target:
        return None

    def seconds(key: str) -> float:  # this phase's seconds over the ideal's
        return (figure(row, key) or 0.0) * epoch - (figure(base, key) or 0.0) * target

    stragglers = seconds("straggler_share") if row.get("straggler_share") is not None else None
    wait = seconds("allreduce_share" if row.get("allreduce_share") is not None else "comm_wait_share")
    parts: dict[str, float | None] = {
        "compute": seconds("forward_backward_share") - wait - (stragglers or 0.0),
        "all-reduce wait": wait,
        "stragglers": stragglers,
        "optimizer": seconds("optimizer_share"),
        "data": seconds("data_share"),
    }
    parts["the rest of the step"] = (epoch - target) - sum(v for v in parts.values() if v is not None)
    present = {k: v for k, v in parts.items() if v is not None}
    biggest = max(present, key=present.__getitem__)
    return Gap(epoch_s=epoch, ideal_epoch_s=target, parts=parts, biggest=biggest, why=why(biggest, row, base))


def why(part: str, row: Row, base: Row) -> str:
    """What the biggest part of a scaling gap usually means, for the findings."""
    smaller = (
        (mine := setting(row, "local_batch")) is not None
        and (theirs := setting(base, "local_batch")) is not None
        and mine < theirs
    )
    on_cuda = str(row.get("device", "")).startswith("cuda")
    if part == "compute":
        if smaller:
            return (
                f"each worker computes a local batch of {row['local_batch']} against {base['local_batch']}: "
                "the device is less busy per image"
            )
        return (
            "the GPUs compute more slowly together than one alone"
            if on_cuda
            else "the processes share the machine's cores"
        )
    nodes = setting(row, "nodes") or 1
    if part == "all-reduce wait" and nodes > 1:
        over = f" ({row['link']})" if row.get("link") else ""
        return (
            f"the gradients' all-reduce crosses the link between the {nodes} nodes{over} and backward does not hide it"
        )
    if part == "stragglers" and row.get("straggler") not in (None, "mixed"):
        return f"the ranks wait at each all-reduce for {row['straggler']}"
    return {
        "all-reduce wait": "the gradients' all-reduce is not hidden behind backward",
        "stragglers": "the ranks wait for the slowest one at each all-reduce",
        "data": "loading the batches takes longer per worker than alone",
        "optimizer": "the optimizer step takes longer per worker than alone",
    }.get(part, "host work between phases")


# ---- curves --------------------------------------------------------------------------------
CURVE_KEYS = ("train_loss", "test_loss", "train_acc", "test_acc", "train_eval_loss", "train_eval_acc")


def mean_curve(histories: list[list[EpochRecord]]) -> list[dict[str, Any]]:
    """Per-epoch mean and std over a point's seeds, up to the epoch every seed reached."""
    curve = []
    for i in range(min((len(h) for h in histories), default=0)):
        record: dict[str, Any] = {"epoch": histories[0][i].epoch}
        workers = {h[i].workers for h in histories}  # the seeds' own; None where they differ or were not recorded
        record["workers"] = workers.pop() if len(workers) == 1 else None
        for key in CURVE_KEYS:
            record[key], record[f"{key}_std"] = mean_std([h[i].metric(key) for h in histories])
        curve.append(record)
    return curve


def overfitting(curve: list[dict[str, Any]], patience: int = EARLY_STOP_PATIENCE) -> Overfit | None:
    """What a point's mean curve says about overfitting; None with fewer than two epochs.

    `overfits`: the test loss ends more than OVERFIT_RISE above its minimum while the training
    loss (on training images in eval mode when measured) kept falling after that minimum.
    `stop_epoch`: where early stopping on the test loss with `patience` would have stopped
    (None: it would have run to the end); an early-stopped run with the same seed is this run
    cut short there.
    """
    usable = [r for r in curve if r.get("test_loss") is not None and r.get("train_loss") is not None]
    if len(usable) < 2:
        return None
    train_key = "train_eval_loss" if all(r.get("train_eval_loss") is not None for r in usable) else "train_loss"
    low = min(usable, key=lambda r: r["test_loss"])
    last = usable[-1]
    # Rounded, so a rise of exactly 10% is not pushed over the line by float error.
    rise = round(last["test_loss"] / low["test_loss"] - 1, 9) if low["test_loss"] > 0 else 0.0
    stop = early_stop_epoch(usable, patience)
    stopped = next((r for r in usable if r["epoch"] == stop), None)
    return Overfit(
        min_epoch=low["epoch"],
        min_test_loss=low["test_loss"],
        final_test_loss=last["test_loss"],
        rise=rise,
        overfits=rise > OVERFIT_RISE and last[train_key] < low[train_key],
        train_key=train_key,
        stop_epoch=stop,
        stop_test_acc=stopped.get("test_acc") if stopped else None,
        epochs=last["epoch"],
    )


def early_stop_epoch(curve: list[dict[str, Any]], patience: int) -> int | None:
    """The epoch after which training's own early stopping (on test loss, `patience`) would have stopped."""
    from ddplab.metrics.early_stop import EarlyStopping  # torch-free: the rule has one owner, below engine and report

    rule = EarlyStopping("test_loss", patience)
    return next((r["epoch"] for r in curve if rule.update(r["epoch"], r["test_loss"])), None)
