"""Sentences that answer the questions users ask of their runs, computed from the report's tables.

Does more workers pay off, and what eats the time? Does one change (precision, backend,
optimizer...) matter beyond seed noise? Does a run overfit? Which point is best, which
fastest? Every function here is pure: rows and curves in, strings out.
"""

from __future__ import annotations

from typing import Any

from ddplab.report.runs import value_text

OVERFIT_RISE = 0.10  # test loss this far above its minimum at the end counts as overfitting
SCALING_FIELDS = ("dist.nproc", "dist.nnodes")  # covered by the scaling sentences
DATA_BOUND_SHARE = 0.25  # a data share this large is worth saying: the input pipeline limits the step


def build_findings(points: list[dict[str, Any]], configs: list[dict[str, Any]], curves: list[list[dict[str, Any]]],
                   runs: list[dict[str, Any]]) -> list[str]:
    """All findings, in reading order: outcome, scaling, single changes, overfitting, runs to check."""
    if not points:
        return ["no run finished: nothing to compare (see the runs that did not finish)"]
    return [*best_and_fastest(points), *scaling(points), *single_changes(points, configs),
            *axis_changes(points, configs), *overfitting_findings(points, curves), *run_notes(runs)]


def speed_text(ratio: float) -> str:
    return f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"


def best_and_fastest(points: list[dict[str, Any]]) -> list[str]:
    scored = [p for p in points if p.get("final_test_acc") is not None]
    timed = [p for p in points if p.get("epoch_s")]
    out = []
    if scored:
        best = max(scored, key=lambda p: p["final_test_acc"])
        std = best.get("final_test_acc_std")
        spread = f" ± {100 * std:.2f}" if std is not None else ""
        out.append(f"best accuracy: {best['point']}, {100 * best['final_test_acc']:.2f}%{spread} final test accuracy")
    if len(timed) > 1:
        fast = min(timed, key=lambda p: p["epoch_s"])
        rate = f" ({fast['images_per_s']:,.0f} images/s)" if fast.get("images_per_s") else ""
        out.append(f"fastest: {fast['point']}, {fast['epoch_s']:.2f} s per epoch{rate}")
    return out


def scaling(points: list[dict[str, Any]]) -> list[str]:
    """One sentence per multi-worker point with a 1-worker baseline: speedup, efficiency, shares."""
    scaled = [p for p in points if p.get("speedup") and isinstance(p.get("world_size"), int) and p["world_size"] > 1]
    names = [f"{p['strategy']} x{p['world_size']} (batch {p['local_batch']})" for p in scaled]
    out = []
    for p, name in zip(scaled, names):
        if names.count(name) > 1:  # other axes differ too: say which point
            name = f"{name} [{p['point']}]"
        text = f"{name}: {speed_text(p['speedup'])} per epoch than 1 worker, {p['efficiency']:.0%} efficiency"
        if p.get("comm_wait_share") is not None:
            text += f", communication {p['comm_wait_share']:.0%} of step time"
        if (p.get("data_share") or 0) >= DATA_BOUND_SHARE:
            text += f", data loading {p['data_share']:.0%} (input-bound)"
        out.append(text)
    return out


def differing(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return [k for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]


def single_changes(points: list[dict[str, Any]], configs: list[dict[str, Any]]) -> list[str]:
    """Points that differ from an earlier one in exactly one field, each against its first such baseline."""
    out, done = [], set()
    for i, base in enumerate(points):
        for j in range(i + 1, len(points)):
            fields = differing(configs[i], configs[j]) if configs[i] and configs[j] else []
            if len(fields) != 1 or fields[0] in SCALING_FIELDS or (j, fields[0]) in done:
                continue
            done.add((j, fields[0]))
            field = fields[0]
            head = f"{field}={value_text(configs[j].get(field))} vs {value_text(configs[i].get(field))}"
            # Where other axes vary too, say at which of their values the two points were compared.
            short = field.rsplit(".", 1)[-1] + "="
            context = [part for part in str(points[j].get("point", "")).split(", ") if part and not part.startswith(short)]
            if context and len(points) > 2:
                head += f" ({', '.join(context)})"
            out.append(compare_sentence(head, points[j], base))
    return out


def axis_changes(points: list[dict[str, Any]], configs: list[dict[str, Any]]) -> list[str]:
    """Points one sweep axis apart whose configs differ in several fields (a variant: an optimizer
    with its own lr, BatchNorm with dropout), each against the first value of that axis.

    One-field differences are already said by `single_changes`, and differences in the
    number of workers by `scaling`.
    """
    out, done = [], set()
    for i, base in enumerate(points):
        for j in range(i + 1, len(points)):
            a, b = base.get("axes") or {}, points[j].get("axes") or {}
            axes = differing(a, b)
            if len(axes) != 1 or (j, axes[0]) in done or base.get("world_size") != points[j].get("world_size"):
                continue
            done.add((j, axes[0]))  # the first point one axis away is the baseline, said here or not
            if configs[i] and configs[j] and len(differing(configs[i], configs[j])) <= 1:
                continue
            axis = axes[0]
            head = f"{axis}={value_text(b.get(axis))} vs {value_text(a.get(axis))}"
            others = [f"{k}={value_text(v)}" for k, v in b.items() if k != axis]
            if others:
                head += f" ({', '.join(others)})"
            out.append(compare_sentence(head, points[j], base))
    return out


def compare_sentence(head: str, new: dict[str, Any], base: dict[str, Any]) -> str:
    """`head: 1.40x faster, -0.2 points accuracy, within noise (std 0.3)`, parts missing where data is."""
    parts = []
    if new.get("epoch_s") and base.get("epoch_s"):
        parts.append(speed_text(base["epoch_s"] / new["epoch_s"]))
    if new.get("final_test_acc") is not None and base.get("final_test_acc") is not None:
        diff = 100 * (new["final_test_acc"] - base["final_test_acc"])
        parts.append(f"{diff:+.1f} points accuracy")
        parts.append(noise_text(diff, [new.get("final_test_acc_std"), base.get("final_test_acc_std")]))
    mem_new, mem_base = new.get("peak_mib"), base.get("peak_mib")
    if mem_new and mem_base and new.get("memory_label") == base.get("memory_label") and abs(mem_new / mem_base - 1) >= 0.05:
        parts.append(f"peak memory {mem_new:,.0f} vs {mem_base:,.0f} MiB")
    return f"{head}: {', '.join(parts)}" if parts else f"{head}: no figures to compare"


def noise_text(diff_points: float, stds: list[float | None]) -> str:
    """Within noise when the difference is at most twice the larger seed std (both in points)."""
    known = [100 * s for s in stds if s is not None]
    if not known:
        return "single seed: noise not measured"
    std = max(known)
    return f"{'within' if abs(diff_points) <= 2 * std else 'beyond'} noise (std {std:.1f})"


def overfitting(curve: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Where test loss bottomed out, if it ends >10% above that minimum while train loss kept falling."""
    usable = [r for r in curve if r.get("test_loss") is not None and r.get("train_loss") is not None]
    if len(usable) < 2:
        return None
    low, last = min(usable, key=lambda r: r["test_loss"]), usable[-1]
    # Rounded, so a rise of exactly 10% is not pushed over the line by float error.
    rise = round(last["test_loss"] / low["test_loss"] - 1, 9) if low["test_loss"] > 0 else 0.0
    if rise > OVERFIT_RISE and last["train_loss"] < low["train_loss"]:
        return {"epoch": low["epoch"], "rise": rise}
    return None


def overfitting_findings(points: list[dict[str, Any]], curves: list[list[dict[str, Any]]]) -> list[str]:
    out = []
    for p, curve in zip(points, curves):
        who = f"run {p['runs']}" if p["seeds"] == 1 else f"{p['point']} (mean of {p['seeds']} seeds)"
        found = overfitting(curve)
        gap = p.get("acc_gap")
        if found:
            text = (f"{who} overfits from epoch {found['epoch']}: test loss {found['rise']:+.0%} from its minimum "
                    "while train loss falls")
            out.append(text + (f"; train-test accuracy gap {100 * gap:.1f} points" if gap is not None else ""))
        elif gap is not None and gap >= 0.10:
            out.append(f"{who}: train accuracy {100 * gap:.1f} points above test, though test loss has not risen "
                       f"{OVERFIT_RISE:.0%} above its minimum")
    if not out and any(len(c) > 1 for c in curves):
        out.append(f"no overfitting: every point's test loss ends within {OVERFIT_RISE:.0%} of its minimum")
    return out


def run_notes(runs: list[dict[str, Any]]) -> list[str]:
    """Runs that stopped early, and how many did not finish."""
    out = [f"run {r['run']} stopped early after {r['epochs']} epochs (test loss stopped improving)"
           for r in runs if r["status"] == "stopped_early" and r.get("epochs")]
    problems = [r for r in runs if "final_test_acc" not in r]
    if problems:
        kinds = {s: sum(r["status"] == s for r in problems) for s in dict.fromkeys(r["status"] for r in problems)}
        listing = ", ".join(f"{n} {s}" for s, n in kinds.items())
        out.append(f"{len(problems)} run{'s' * (len(problems) != 1)} did not finish ({listing}): listed at the end")
    return out
