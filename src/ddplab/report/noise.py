"""When a difference between two points is an effect, when it is noise, and when the clocks cannot say.

The report states a difference as an effect only when its own data support it:

Timing. A point's training throughput (images per second of training, epochs after the
first) has a noise: over seeds, the relative standard deviation of the runs' throughputs
(run-to-run noise). Two points differ *beyond noise* when their ratio is further from 1
than `NOISE_SIGMAS` times the two noises combined, and at least `MIN_TIMING_EFFECT`. With
one run on either side the verdict is *single run*, never an effect: a run's own spread
over equal windows of training (steps.jsonl, shown beside it) says nothing of the next
run's. A comparison is *unreliable* when a run
on either side competed with other work while it trained (`contended`): other processes
used `CONTENDED_OTHER_CPU` of the CPUs or the hypervisor stole `CONTENDED_STEAL`, or
another process shared its GPU. The clocks then measured the load, not the setting.

Accuracy. A difference of final test accuracy is within noise when it is at most
`NOISE_SIGMAS` times the larger of: each side's standard deviation over seeds, and the
sampling noise of the test set itself (sqrt(p(1-p)/n) for n test images). With one seed
per side the seed noise is unknown, and the verdict says so.

Pure functions over the report's rows and runs; no torch.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from ddplab.report.records import Load, Row, Timing, Verdict, setting
from ddplab.rundir.epochs import EpochRecord, refresh_windows, timed_epochs, worst_reading

NOISE_SIGMAS = 2.0  # a difference beyond this many standard deviations is an effect
MIN_TIMING_EFFECT = 0.03  # timing ratios closer to 1 than 3% are never called an effect (run-to-run drift)
MIN_WINDOWS = 5  # fewer timing windows than this give no within-run noise
WARMUP_FRACTION = 0.2  # a one-epoch run's first 20% of windows still warm up: left out


# ---- what a run competed with -----------------------------------------------------------------


def run_load(history: list[EpochRecord], *, shared_device: bool = False) -> Load:
    epochs = timed_epochs(history)
    gpu = worst_reading(epochs, "gpu_other_processes")
    return Load(
        other_cpu=worst_reading(epochs, "other_cpu_share"),
        steal=worst_reading(epochs, "steal_share"),
        gpu_others=None if gpu is None else int(gpu),
        shared_device=shared_device,
    )


def combine_loads(loads: list[Load]) -> Load:
    """A point's load: the worst of its runs'."""

    def worst(values: list[Any]) -> Any:
        known = [v for v in values if v is not None]
        return max(known) if known else None

    return Load(
        other_cpu=worst([x.other_cpu for x in loads]),
        steal=worst([x.steal for x in loads]),
        gpu_others=worst([x.gpu_others for x in loads]),
        shared_device=any(x.shared_device for x in loads),
    )


# ---- timing noise ------------------------------------------------------------------------------
def window_rates(steps: list[dict[str, Any]], images_per_step: int, epochs: int) -> list[float]:
    """Training images per second between consecutive progress refreshes of one epoch (steps.jsonl),
    over the epochs the report times; a one-epoch run's first windows are left out as warm-up."""
    rates = [ds * images_per_step / dt for dt, ds in refresh_windows(steps, epochs)]
    if epochs <= 1:
        rates = rates[int(len(rates) * WARMUP_FRACTION) :]
    return rates


def within_run_noise(rates: list[float]) -> float | None:
    """Relative standard error of a run's mean throughput from its windows; None with too few."""
    if len(rates) < MIN_WINDOWS:
        return None
    mean = statistics.fmean(rates)
    return statistics.stdev(rates) / mean / math.sqrt(len(rates)) if mean > 0 else None


def point_timing(rates: list[float | None], within: list[float | None]) -> Timing | None:
    """From each run's throughput and within-run noise: over seeds the run-to-run spread (never less
    than the runs' own noise), for one run its within-run noise."""
    known = [r for r in rates if r]
    if not known:
        return None
    mean = statistics.fmean(known)
    inner = [w for w in within if w is not None]
    if len(known) > 1:
        spread = statistics.stdev(known) / mean
        return Timing(mean, max([spread, *inner]), "seeds")
    return Timing(mean, inner[0] if inner else None, "within-run" if inner else "none")


def timing_verdict(ratio: float, a: Timing | None, b: Timing | None, loads: dict[str, Load]) -> Verdict:
    """Is `ratio` (a's throughput over b's) an effect of the setting? `loads`: each side's runs' load, by name."""
    contended = [f"{name}: {load.why()}" for name, load in loads.items() if load.contended]
    if contended:
        return Verdict("unreliable", "the clocks measured other work; " + "; ".join(contended))
    if a is None or b is None or a.basis != "seeds" or b.basis != "seeds" or a.noise is None or b.noise is None:
        # A run's own spread says nothing of the next run: on an idle VM, steady runs of the same work
        # differed by 45% (BENCHMARKS.md). Only repeats measure the noise between runs.
        return Verdict("single run", "one run per side cannot tell an effect from run-to-run noise: set sweep.repeats")
    threshold = max(NOISE_SIGMAS * math.hypot(a.noise, b.noise), MIN_TIMING_EFFECT)
    word = "beyond noise" if abs(math.log(ratio)) > math.log1p(threshold) else "within noise"
    why = f"±{threshold:.0%}, over seeds"
    unknown = [name for name, load in loads.items() if not load.measured]
    if unknown:
        why += f"; load not recorded for {', '.join(unknown)}"
    return Verdict(word, why)


# ---- accuracy noise ----------------------------------------------------------------------------
def sampling_std(acc: float | None, count: int | None) -> float | None:
    """The standard deviation of an accuracy measured on `count` images (the test set's own noise)."""
    if acc is None or not count:
        return None
    return math.sqrt(max(acc * (1 - acc), 0.0) / count)


def accuracy_noise(row: Row) -> tuple[float | None, bool]:
    """(noise of the point's final test accuracy, whether seeds measured it)."""
    seed_std = row.get("final_test_acc_std")
    sampling = sampling_std(row.get("final_test_acc"), setting(row, "test_images"))
    known = [v for v in (seed_std, sampling) if v is not None]
    return (max(known) if known else None), seed_std is not None


def accuracy_verdict(diff: float, a: Row, b: Row) -> Verdict:
    """`diff` (a - b, a fraction) against both points' noise."""
    (na, seeds_a), (nb, seeds_b) = accuracy_noise(a), accuracy_noise(b)
    known = [n for n in (na, nb) if n is not None]
    if not known:
        return Verdict("noise not measured")
    noise = max(known)
    beyond = abs(diff) > NOISE_SIGMAS * noise
    if not (seeds_a and seeds_b):  # the test set's sampling noise is only a floor under the seeds' spread
        if beyond:
            return Verdict(
                "single seed",
                f"beyond the test set's sampling noise of {100 * noise:.1f} points; the "
                "spread over seeds is not measured: set sweep.repeats",
            )
        return Verdict("within noise", f"noise {100 * noise:.1f} points, one seed: test-set sampling noise only")
    return Verdict("beyond noise" if beyond else "within noise", f"noise {100 * noise:.1f} points, std over seeds")
