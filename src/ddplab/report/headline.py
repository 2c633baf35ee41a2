"""Each section's answer in one sentence with its verdict: the report's first screen lists them, and each
section's answer starts with its own. Every figure in it is one of the section's table cells, as in the
findings (the detail stays there)."""

from __future__ import annotations

from ddplab.report.findings import MEMORY_CHANGE, accuracy_lead, pct
from ddplab.report.kinds import kind_of
from ddplab.report.records import Comparison, Section, Verdict, judged
from ddplab.report.tables import faster, memory_title, mib, points_value, rate, times


def short(verdict: Verdict) -> str:
    """A verdict in a few words: the one that voids a timing says why (a busy machine, or workers sharing a
    device on purpose: either way the clocks measured other work)."""
    return "unreliable (the clocks measured other work)" if verdict.word == "unreliable" else verdict.word


def headline(section: Section) -> str:
    """The answer from what ran, then the points this machine could not run (a 1-GPU machine's DDP points):
    an answer over fewer points than the question names says so on the first screen."""
    absent = ", ".join(dict.fromkeys(point for point, _ in section.not_measured))
    if not section.rows:
        return f"not measured on this machine: {absent}" if absent else "no run finished: nothing to answer"
    missing = section.missing_baseline
    answer = (
        f"no comparison: the baseline ({', '.join(missing)}) did not finish; {most_accurate(section)}"
        if missing
        else from_the_runs(section)
    )
    return f"{answer}; not measured here: {absent}" if absent else answer


def from_the_runs(section: Section) -> str:
    kind = kind_of(section).name
    if kind == "scaling":  # no pair at all: only the baseline ran
        return scaling(section) or ("not timed; " if section.pairs else "") + most_accurate(section)
    if kind == "regularization":  # the question is overfitting: its answer first, speed after
        return regularization(section) or comparison(section.pairs) or most_accurate(section)
    if kind == "compare":
        return comparison(section.pairs) or most_accurate(section)
    if kind == "overfitting":
        return overfitting(section)
    if kind == "run":
        return most_accurate(section)
    return "; ".join(filter(None, (most_accurate(section), scaling(section)))) or "nothing to answer"


def scaling(section: Section) -> str:
    """The pair with the most workers: its speedup, share of the ideal and verdict, and what costs it most."""
    pairs = [c for c in section.pairs if c.scaling and c.speedup is not None]
    if not pairs:
        return ""
    c = max(pairs, key=lambda p: (p.ideal or 0, w if isinstance(w := p.row.get("world_size"), int) else 0))
    text = f"{c.point}: {times(c.speedup)} the training throughput of {c.baseline}"
    if c.efficiency is not None and c.ideal:
        text += f", {c.efficiency:.0%} of the ideal {c.ideal:g}x"
    text += f", {short(c.timing_verdict)}"
    if c.superlinear:
        text += ", super-linear: check"
    if c.gap is not None and c.gap.biggest == "stragglers" and c.row.get("straggler") not in (None, "mixed"):
        text += f"; the biggest part of the gap: waiting for {c.row['straggler']}"
    elif c.gap is not None:
        text += f"; the biggest part of the gap: {c.gap.biggest}"
    return text


def comparison(pairs: list[Comparison]) -> str:
    """The fastest point and the most accurate one against their baseline, each with its verdict ("largest
    speedup" and "largest accuracy gain" where the pairs have different baselines); where none beats its
    baseline, the closest. The fastest's peak memory beside its speed, where it differs by MEMORY_CHANGE or more
    (a precision question asks speed and memory first)."""
    timed = [c for c in pairs if c.speedup is not None]
    scored = [c for c in pairs if c.acc_diff is not None]
    one_baseline = len({c.baseline for c in pairs}) == 1
    parts = []
    if timed:
        c = max(timed, key=lambda p: p.speedup or 0.0)
        if c.timing_verdict.word == "within noise":  # no ratio read as an effect
            parts.append(
                f"none faster or slower than {c.baseline} beyond noise (fastest {c.point}: {times(c.speedup)} "
                "its training throughput)"
            )
        elif (c.speedup or 0.0) >= 1:
            best = "fastest" if one_baseline else "largest speedup"
            parts.append(
                f"{best} {c.point}: {faster(c.speedup)} than {c.baseline}, {short(c.timing_verdict)}{memory(c)}"
            )
        else:
            parts.append(
                f"none faster than {c.baseline} (closest {c.point}: {faster(c.speedup)}, "
                f"{short(c.timing_verdict)}{memory(c)})"
            )
    if scored:
        c = max(scored, key=lambda p: p.acc_diff or 0.0)
        if (c.acc_diff or 0.0) > 0:
            best = "most accurate" if one_baseline else "largest accuracy gain"
            parts.append(
                f"{best} {c.point}: {points_value(c.acc_diff)} points of test accuracy vs {c.baseline}, "
                f"{c.acc_verdict.word}"
            )
        else:
            parts.append(
                f"none more accurate than {c.baseline} (closest {c.point}: {points_value(c.acc_diff)} points, "
                f"{c.acc_verdict.word})"
            )
    return "; ".join(parts)


def memory(c: Comparison) -> str:
    """ ", 812 vs 1,024 peak RSS MiB/rank" where the pair's peaks differ enough to say (the table's cells, as every
    figure of an answer is)."""
    m, mb = c.row.get("peak_mib"), c.base.get("peak_mib")
    if not m or not mb or c.row.get("memory_label") != c.base.get("memory_label") or abs(m / mb - 1) < MEMORY_CHANGE:
        return ""
    return f", {mib(m)} vs {mib(mb)} {memory_title([c.row])}"


def regularization(section: Section) -> str:
    """What a remedy is for, first: the point with the smallest train-test gap against its baseline's, and whether
    its test loss still rises at the end; then the accuracy it bought, with its verdict."""
    pairs = [c for c in section.pairs if c.row.get("acc_gap") is not None and c.base.get("acc_gap") is not None]
    if not pairs:
        return ""
    c = min(pairs, key=lambda p: p.row.get("acc_gap") or 0.0)
    text = (
        f"least overfitting {c.point}: train-test gap {points_value(c.row['acc_gap'])} vs "
        f"{points_value(c.base['acc_gap'])} points of {c.baseline}"
    )
    o, ob = c.row.get("overfit"), c.base.get("overfit")
    if o is not None and ob is not None:
        if o.overfits:
            text += f", its test loss still rising ({o.rise:+.0%} past its lowest; {c.baseline}: {ob.rise:+.0%})"
        elif ob.overfits:
            text += f", its test loss no longer rising ({c.baseline}'s: {ob.rise:+.0%} past its lowest)"
        else:
            text += ", neither's test loss rising"
    if c.acc_diff is not None:
        text += f"; {points_value(c.acc_diff)} points of test accuracy, {c.acc_verdict.word}"
    return text


def most_accurate(section: Section) -> str:
    """One point: its accuracy and speed. Several: the most accurate, and whether it leads the next beyond noise."""
    rows, verdict = accuracy_lead(section.rows)
    if not rows:
        return ""
    best = rows[0]
    if verdict is None:
        text = f"{best['point']}: {pct(best, 'final_test_acc')} test accuracy"
        return text + (f" at {rate(best['images_per_s'])} training images/s" if best.get("images_per_s") else "")
    second = rows[1]
    return (
        f"most accurate {best['point']}: {pct(best, 'final_test_acc')} test accuracy, {verdict.word} against "
        f"{second['point']} ({pct(second, 'final_test_acc')})"
    )


def overfitting(section: Section) -> str:
    """How many points overfit, the worst of them, and the points it could not judge (fewer than two epochs)."""
    seen = [r for r in section.rows if r.get("overfit") is not None]
    if not seen:
        return most_accurate(section)
    unjudged = [r["point"] for r in section.rows if r.get("overfit") is None]
    rest = f"; not judged: {', '.join(unjudged)}" if unjudged else ""
    over = [r for r in seen if judged(r).overfits]
    if not over:
        epochs = sorted({judged(r).epochs for r in seen})
        span = f"{epochs[0]}" if len(epochs) == 1 else f"{epochs[0]}-{epochs[-1]}"
        return f"none of {len(seen)} overfits in {span} epochs{rest}"
    worst = max(over, key=lambda r: judged(r).rise)
    o = judged(worst)
    return (
        f"{len(over)} of {len(seen)} overfit; most {worst['point']}: test loss lowest at epoch {o.min_epoch}, "
        f"{o.rise:+.0%} by epoch {o.epochs}{rest}"
    )
