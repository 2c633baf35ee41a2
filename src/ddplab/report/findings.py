"""Sentences that answer a section's question, each restating cells of the section's tables.

Does more workers pay off, and if it seems to pay more than it can, why? Does one change
(precision, backend, a remedy) matter beyond noise? Does a run overfit, where would early
stopping have stopped? A timing is never stated as an effect when its own data mark it as
noise or as measured under load (`report.noise`); every figure is formatted by
`report.tables`, as in the tables. Pure functions: a section in, findings out.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddplab.report import figures, noise
from ddplab.report.records import Comparison, PairPrediction, Row, Section, Verdict, figure, setting
from ddplab.report.tables import (
    band_range,
    faster,
    loss,
    memory_title,
    mib,
    ms,
    percent_value,
    points_value,
    rate,
    seconds,
    seconds_signed,
    times,
)

DATA_BOUND_SHARE = 0.25  # a data share this large is worth saying: the input pipeline limits the step
GAP_WORTH_SAYING = 0.10  # train accuracy this far above test is said even without a rising test loss
MEMORY_CHANGE = 0.05  # peak memory differences under 5% are not mentioned
COMM_AGREE, COMM_AGREE_MS = 0.5, 0.5  # probe and DDP's timers agree within 50% or half a millisecond a step
IDLE_CORES = 0.85  # a baseline that kept fewer than 85% of the cores busy left room for more processes


@dataclass(frozen=True)
class Finding:
    text: str
    flag: str = ""  # "" | "unreliable": the data cannot support it as an effect | "check": a result to question
    #                 | "missing": what was not measured or did not finish (the text says which)

    def __str__(self) -> str:
        return self.text


def all_findings(section: Section) -> list[Finding]:
    return (
        best_accuracy(section.rows)
        + scaling_findings(section)
        + comparison_findings([p for p in section.pairs if not p.scaling])
        + overfitting_findings(section.rows, brief=True)
    )


def regularization_findings(section: Section) -> list[Finding]:
    return comparison_findings(section.pairs, overfit=True) + overfitting_findings(
        [r for r in section.rows if r.get("is_baseline")]
    )


def pct(row: Row, key: str) -> str:
    value = figure(row, key)
    return f"{percent_value(value)}%" if value is not None else "-"


def train_acc(row: Row) -> str:
    key = "train_eval_acc" if row.get("train_eval_acc") is not None else "final_train_acc"
    basis = "training images in eval mode" if key == "train_eval_acc" else "running mean over augmented batches"
    return f"{pct(row, key)} ({basis})"


# ---- one run's figures (what a single device did) ------------------------------------------------
def run_findings(rows: list[Row]) -> list[Finding]:
    out = []
    for r in rows:
        text = (
            f"{r['point']}: test accuracy {pct(r, 'final_test_acc')}, train accuracy {train_acc(r)}: a gap of "
            f"{points_value(r.get('acc_gap'))} points; {r['epochs']:g} epochs in {seconds(r['total_s'])} s, of which "
            f"{seconds(r['train_s'])} s training"
        )
        if r.get("images_per_s"):
            text += f" at {rate(r['images_per_s'])} training images/s"
        out.append(Finding(text))
    return out


# ---- scaling ---------------------------------------------------------------------------------------
def scaling_findings(section: Section) -> list[Finding]:
    out = []
    cpus = section.cpus()
    for c in (p for p in section.pairs if p.scaling):
        r, b, verdict = c.row, c.base, c.timing_verdict
        if c.speedup is None:
            out.append(Finding(f"{c.point}: not timed"))
            continue
        text = (
            f"{c.point}: {times(c.speedup)} the training throughput of {c.baseline} "
            f"({rate(r['images_per_s'])} vs {rate(b['images_per_s'])} images/s), "
            f"{c.efficiency:.0%} of the ideal {c.ideal:g}x; {verdict.text()}"
        )
        if c.ideal == 1 and not str(r.get("device", "")).startswith("cuda"):
            text += (
                f". On a CPU both sides share the same {cpus or ''}{' ' if cpus else ''}cores: the workers add "
                "no compute, so the ideal is 1x and this shows what splitting the work costs or gains"
            )
        if c.predicted is not None:
            text += prediction_text(c.predicted, c.speedup, c.baseline)
        gap = c.gap
        if gap is not None:
            parts = ", ".join(
                f"{name} {seconds_signed(value)} s" if value is not None else f"{name} not measured"
                for name, value in gap.parts.items()
            )
            text += (
                f". Why it falls short of the ideal: {seconds(gap.epoch_s)} s a training epoch against an ideal "
                f"{seconds(gap.ideal_epoch_s)} s; {parts}; the most: {gap.biggest} ({gap.why})"
            )
        text += communication_text(c)
        if c.acc_diff is not None:
            text += f". Test accuracy {pct(r, 'final_test_acc')} vs {pct(b, 'final_test_acc')}: {c.acc_verdict.text()}"
            if r.get("global_batch") == b.get("global_batch"):
                text += f" (the same global batch of {r['global_batch']}: the same optimizer steps)"
        if (r.get("comm_wait_share") or 0) > 0:
            text += f"; communication wait {pct(r, 'comm_wait_share')} of training time"
        if (r.get("data_share") or 0) >= DATA_BOUND_SHARE:
            text += f"; data loading {pct(r, 'data_share')} of it (input-bound)"
        out.append(Finding(text, "unreliable" if verdict.word == "unreliable" else ""))
        if c.superlinear:
            out.append(
                Finding(
                    f"{c.point} is super-linear ({c.efficiency:.0%} of the ideal), more than extra "
                    f"hardware can give; likely cause: {superlinear_cause(c, cpus)}",
                    "check",
                )
            )
    return out


def communication_text(c: Comparison) -> str:
    """The all-reduce measured two ways, against the link where one was measured, and the stragglers."""
    r = c.row
    probe, ddp = r.get("probe_comm_ms"), r.get("ddp_exposed_ms")
    if ddp is None or probe is None:
        return ""
    agree = (
        "they agree"
        if abs(probe - ddp) <= max(COMM_AGREE_MS, COMM_AGREE * max(probe, ddp))
        else "they disagree (the probe times one step in eval mode a few times an epoch, DDP the training steps "
        "it timed; the epoch is taken apart with DDP's)"
    )
    text = (
        f". The all-reduce per step: ddplab's probe {ms(probe)} ms of wait, DDP's own timers {ms(ddp)} ms exposed "
        f"on the rank that waited least ({ms(r['ddp_comm_ms'])} ms from the first bucket's launch to the last "
        f"one's end): {agree}; rank 0 waited {ms(r['straggler_ms'])} ms a step for the slowest rank"
    )
    if c.predicted is not None and c.predicted.link_ms is not None:
        text += f"; this machine's measured link predicts {ms(c.predicted.link_ms)} ms for the gradients"
    return text


def prediction_text(p: PairPrediction, measured: float, baseline: str) -> str:
    """The model's speedup against the measured one: inside or outside the band its checked cases' measurements
    fell in (outside: further from the prediction, on that side, than any checked case; news either way, as a
    band that lies wholly on one side of its predictions records the model's bias, not only its spread)."""
    said = (
        f". The scaling model (ddplab plan) predicted {times(p.speedup)} from {baseline} over this machine's "
        "measured link"
    )
    if p.band is None:
        return said + f"; measured {times(measured)}"
    if not p.band.cases:
        return said + f"; measured {times(measured)} ({p.band.text()})"
    band = f"({band_range(p)}: {p.band.text()})"
    if p.band.holds(p.speedup, measured):
        return said + f"; the measured {times(measured)} is inside its error band {band}"
    ratio = measured / p.speedup
    return said + (
        f"; the measured {times(measured)} is OUTSIDE its error band, {ratio - 1:+.0%} of the prediction: "
        f"{'above' if ratio > p.band.hi else 'below'} it by more than {p.band.beyond()} {band}"
    )


def superlinear_cause(c: Comparison, cpus: int | None) -> str:
    r, b = c.row, c.base
    if cpus and (cores := b.get("cores_busy")) is not None and cores < IDLE_CORES * cpus:
        busy = f", {c.point} {r['cores_busy']:.2f}" if r.get("cores_busy") is not None else ""
        return (
            f"{c.baseline} kept {b['cores_busy']:.2f} of {cpus} cores busy{busy}: one process's threads leave "
            "cores idle on small layers, several processes fill them "
            "(a better-tuned single process would close the gap)"
        )
    if (b.get("data_share") or 0) >= DATA_BOUND_SHARE:
        return f"{c.baseline} spent {pct(b, 'data_share')} of its training time on data: the baseline was input-bound"
    if (
        (mine := setting(r, "local_batch")) is not None
        and (theirs := setting(b, "local_batch")) is not None
        and mine < theirs
    ):
        return (
            f"each worker's smaller batch ({r['local_batch']} vs {b['local_batch']}) may fit the caches better, or "
            f"{c.baseline}'s clock was disturbed: repeat the runs"
        )
    return f"none in the data: {c.baseline}'s clock may have been disturbed; repeat the runs"


# ---- one change at a time ---------------------------------------------------------------------------
def comparison_findings(pairs: list[Comparison], overfit: bool = False) -> list[Finding]:
    out = []
    for c in pairs:
        r, b, verdict = c.row, c.base, c.timing_verdict
        head = f"{c.point} vs {c.baseline}"
        parts = []
        if c.speedup is not None:
            rates = f"{rate(r['images_per_s'])} vs {rate(b['images_per_s'])} training images/s"
            if verdict.word == "beyond noise":
                parts.append(f"{faster(c.speedup)} ({rates}, {verdict.text()})")
            else:  # the verdict first, so that the ratio is not read as an effect
                parts.append(f"{verdict.word}: {faster(c.speedup)} ({rates}; {verdict.why})")
        if c.acc_diff is not None:
            parts.append(
                f"test accuracy {pct(r, 'final_test_acc')} vs {pct(b, 'final_test_acc')} "
                f"({points_value(c.acc_diff)} points, {c.acc_verdict.text()})"
            )
        if overfit and (o := r.get("overfit")) and (ob := b.get("overfit")):
            parts.append(
                f"test loss {o.rise:+.0%} from its lowest at the end ({c.baseline}: {ob.rise:+.0%}), "
                f"train-test gap {points_value(r.get('acc_gap'))} vs {points_value(b.get('acc_gap'))} points"
            )
        m, mb = r.get("peak_mib"), b.get("peak_mib")
        if m and mb and r.get("memory_label") == b.get("memory_label") and abs(m / mb - 1) >= MEMORY_CHANGE:
            parts.append(f"{memory_title([r])} {mib(m)} vs {mib(mb)}")
        out.append(
            Finding(
                f"{head}: {'; '.join(parts) or 'no figures to compare'}",
                "unreliable" if verdict.word == "unreliable" else "",
            )
        )
    return out


def accuracy_lead(rows: list[Row]) -> tuple[list[Row], Verdict | None]:
    """The rows with a test accuracy, most accurate first, and whether the first leads the second beyond noise
    (None below two)."""
    scored = sorted(
        (r for r in rows if r.get("final_test_acc") is not None), key=lambda r: -(r.get("final_test_acc") or 0)
    )
    if len(scored) < 2:
        return scored, None
    best, second = scored[0], scored[1]
    return scored, noise.accuracy_verdict(
        (best.get("final_test_acc") or 0) - (second.get("final_test_acc") or 0), best, second
    )


def best_accuracy(rows: list[Row]) -> list[Finding]:
    scored, verdict = accuracy_lead(rows)
    if verdict is None:
        return []
    best, second = scored[0], scored[1]
    lead = "ahead of" if verdict.word in ("beyond noise", "single seed") else "not distinguishable from"
    return [
        Finding(
            f"best test accuracy: {best['point']}, {pct(best, 'final_test_acc')}; {lead} {second['point']} "
            f"({pct(second, 'final_test_acc')}): {verdict.text()}"
        )
    ]


# ---- overfitting --------------------------------------------------------------------------------------
def overfitting_findings(rows: list[Row], brief: bool = False) -> list[Finding]:
    out = []
    for r in rows:
        o = r.get("overfit")
        if o is None:
            continue
        low = f"lowest at epoch {o.min_epoch} ({loss(o.min_test_loss)})"
        if o.overfits:
            train = "on training images in eval mode" if o.train_key == "train_eval_loss" else "(running)"
            text = (
                f"{r['point']} overfits: its test loss was {low} and ends {o.rise:+.0%} above it "
                f"({loss(o.final_test_loss)} at epoch {o.epochs}) while the training loss {train} kept "
                f"falling; train accuracy {train_acc(r)} vs test {pct(r, 'final_test_acc')}, a gap of "
                f"{points_value(r.get('acc_gap'))} points"
            )
        else:
            text = (
                f"{r['point']} does not overfit in {o.epochs} epochs: its test loss ends {o.rise:+.0%} from its {low}"
            )
            if (r.get("acc_gap") or 0) >= GAP_WORTH_SAYING:
                text += f", though train accuracy is {points_value(r['acc_gap'])} points above test"
        if not brief:
            if o.stop_epoch is not None and o.stop_epoch < o.epochs:
                text += (
                    f". Early stopping on test loss (patience {figures.EARLY_STOP_PATIENCE}) would have stopped after "
                    f"epoch {o.stop_epoch}, at {percent_value(o.stop_test_acc)}% test accuracy (the same run, "
                    "cut short)"
                )
            else:
                text += f". Early stopping (patience {figures.EARLY_STOP_PATIENCE}) would not have stopped it sooner"
        if brief and not o.overfits and (r.get("acc_gap") or 0) < GAP_WORTH_SAYING:
            continue  # nothing worth a line in a plain sweep
        out.append(Finding(text))
    return out


# ---- what is missing ---------------------------------------------------------------------------------
def not_measured(section: Section) -> list[Finding]:
    out = [Finding(f"not measured here: {point}: {why}", "missing") for point, why in section.not_measured]
    if missing := section.missing_baseline:
        out.append(
            Finding(
                f"the baseline ({', '.join(missing)}) did not finish: no point is compared with it, and the "
                "figures above are each point's own (see the runs that did not finish)",
                "missing",
            )
        )
    return out


def run_notes(section: Section) -> list[Finding]:
    """Runs that stopped early, what of a run's files could not be used, and how many runs did not finish."""
    out = [
        Finding(f"run {r.name} stopped early after {len(r.history)} epochs (test loss stopped improving)")
        for p in section.points
        for r in p.runs
        if r.status == "stopped_early"
    ]
    out += [Finding(f"run {r.name}: {what}", "missing") for p in section.points for r in p.runs for what in r.skipped]
    out += [Finding(what, "missing") for what in section.skipped]
    if section.problems:
        kinds = {
            s: sum(r["status"] == s for r in section.problems)
            for s in dict.fromkeys(r["status"] for r in section.problems)
        }
        listing = ", ".join(f"{n} {s}" for s, n in kinds.items())
        n = len(section.problems)
        out.append(Finding(f"{n} run{'s' * (n != 1)} did not finish ({listing}): listed at the end", "missing"))
    return out
