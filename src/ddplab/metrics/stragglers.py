"""Who is slow: each rank's step clocks added up, and the rule that names a chronic straggler. Torch-free.

Every rank of a DDP step waits in the gradient all-reduce for the last one to join it, so every rank's step
takes as long as the slowest's: step times alone name no one. What differs is when each rank joined the step's
first all-reduce, counted from the start of its step (data, forward and backward up to the first gradient bucket:
`joined_s`); ranks start a step together, as the previous step's all-reduce released them. The rank that joined
last in a step is that step's slowest.

A rank is a chronic straggler when it joined last in most steps (chronic_share; more than chance would give it)
and its median join time is beyond the others' by more than noise (NOISE_SES standard errors of a median over the
steps judged, from the ranks' spreads) and by at least MIN_GAP of theirs; a host whose ranks are all late
together is named as the host. A different slowest rank each step is noise, and
said so. The same rule reads a window of steps live (the log line, the first time it holds) and the run's epochs
at the end (summary.json's `stragglers`).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ddplab.rundir.epochs import ACROSS_EPOCHS, DISTRIBUTED

WINDOW_STEPS = 200  # the live view: the last this many optimizer steps
MIN_STEPS = 20  # fewer steps than this in a window say nothing yet
MIN_GAP = 0.05  # a straggler's median join time is at least this much above the others' median
NOISE_SES = 3.0  # ... and by this many standard errors of a median over the steps judged
MAD_TO_SE = 1.4826 * 1.2533  # a median's standard error, sigma * 1.2533 / sqrt(n), with sigma = 1.4826 * MAD


def chronic_share(ranks: int) -> float:
    """The share of steps a rank must be last in: most steps, and well above chance (1 / ranks)."""
    return max(0.5, min(0.9, 1.5 / ranks))


def distribution(name: str, values: Sequence[float]) -> dict[str, float]:
    """`name`'s median, p95 and max over an epoch's steps (NaN where none was measured)."""
    kept = sorted(v for v in values if v == v)
    nan = float("nan")
    return {
        f"{name}_median_s": statistics.median(kept) if kept else nan,
        f"{name}_p95_s": kept[min(len(kept) - 1, int(0.95 * len(kept)))] if kept else nan,
        f"{name}_max_s": kept[-1] if kept else nan,
    }


def clock_figures(
    step_s: Sequence[float],
    joined_s: Sequence[float],
    last: Sequence[bool],
    data_s: Sequence[float] = (),
    waited_s: Sequence[float] = (),
) -> dict[str, float]:
    """One rank's figures over an epoch's steps: the median, p95 and max of its step times, of its wait for data
    and of its wait in the all-reduce for the last rank to join (`waits`); its join times' median and spread
    (median absolute deviation), and the share of steps it joined last. NaN where none was measured."""
    nan = float("nan")
    joined = [j for j in joined_s if j == j]
    centre = statistics.median(joined) if joined else nan
    return {
        **{
            k: v
            for name, vs in zip(DISTRIBUTED, (step_s, data_s, waited_s), strict=True)
            for k, v in distribution(name, vs).items()
        },
        "joined_median_s": centre,
        "joined_mad_s": statistics.median(abs(j - centre) for j in joined) if joined else nan,
        "last_share": sum(last) / len(last) if joined and last else nan,
    }


def waits(joined_by_rank: Sequence[Sequence[float]]) -> list[list[float]]:
    """For each rank, each step: how long it waited in the step's first all-reduce for the last rank to join it
    (the last one's join time less its own; ranks start a step together). NaN with one rank, or in a step where
    some rank has no join time."""
    ranks = len(joined_by_rank)
    steps = min((len(r) for r in joined_by_rank), default=0)
    out = [[float("nan")] * steps for _ in range(ranks)]
    for i in range(steps):
        column = [joined_by_rank[r][i] for r in range(ranks)]
        if ranks > 1 and all(v == v for v in column):
            for r in range(ranks):
                out[r][i] = max(column) - column[r]
    return out


def last_to_join(joined_by_rank: Sequence[Sequence[float]]) -> list[list[bool]]:
    """For each rank, each step: whether it joined the step's all-reduce last (ties: the lowest rank, never
    two). Steps where some rank has no join time count for no one."""
    ranks = len(joined_by_rank)
    steps = min((len(r) for r in joined_by_rank), default=0)
    out = [[False] * steps for _ in range(ranks)]
    for i in range(steps):
        column = [joined_by_rank[r][i] for r in range(ranks)]
        if ranks > 1 and all(v == v for v in column):
            out[max(range(ranks), key=lambda r: (column[r], -r))][i] = True
    return out


def _steps_offsets(joined_by_rank: Sequence[Sequence[float]], units: Sequence[Sequence[int]]):
    """Each step where every rank joined: its mean join time and, unit by unit, its ranks' join times less each
    rank's own median (a chronically slow rank's offset is taken out: that is who, not noise). Nothing where a
    rank never joined."""
    medians = []
    for row in joined_by_rank:
        kept = [v for v in row if v == v]
        medians.append(statistics.median(kept) if kept else float("nan"))
    if any(m != m for m in medians):
        return
    for column in zip(*joined_by_rank, strict=True):
        if all(v == v for v in column) and (mean := statistics.fmean(column)) > 0:
            yield mean, [[column[r] - medians[r] for r in unit] for unit in units]


def spread(joined_by_rank: Sequence[Sequence[float]], groups: Sequence[Sequence[int]] | None = None) -> float:
    """The spread between ranks, as the planner's STRAGGLER reads it: in each step, the standard deviation of the
    ranks' offsets from their own medians, over the step's mean join time; the median over the steps. With
    `groups` (the ranks of each host): the spread between the groups, each group's mean offset in a step standing
    for it, less the share of its own ranks' spread that mean still carries. NaN where no two ranks (groups)
    compare or there are no join times."""
    units = groups if groups is not None else [[r] for r in range(len(joined_by_rank))]
    if len(units) < 2:
        return float("nan")
    ratios = []
    for mean, offsets in _steps_offsets(joined_by_rank, units):
        # a group's mean still carries its ranks' own spread, sigma^2 / k: taken out, so that the groups' spread
        # is what they share (the planner adds a GPU's spread besides); groups of one rank cannot tell them apart
        shared = statistics.variance(statistics.fmean(o) for o in offsets)
        own = [statistics.variance(o) / len(o) for o in offsets if len(o) > 1]
        ratios.append(math.sqrt(max(0.0, shared - (statistics.fmean(own) if own else 0.0))) / mean)
    return statistics.median(ratios) if ratios else float("nan")


def spread_within(joined_by_rank: Sequence[Sequence[float]], groups: Sequence[Sequence[int]]) -> float:
    """The spread inside each group of two or more ranks (a host's: a GPU's spread), as `spread` reads it, the mean
    over the groups in each step; the median over the steps. NaN where no group holds two ranks."""
    units = [u for u in groups if len(u) > 1]
    if not units:
        return float("nan")
    ratios = [
        statistics.fmean(statistics.stdev(o) for o in offsets) / mean
        for mean, offsets in _steps_offsets(joined_by_rank, units)
    ]
    return statistics.median(ratios) if ratios else float("nan")


def spreads(joined_by_rank: Sequence[Sequence[float]], hosts: Sequence[str]) -> dict[str, float]:
    """The spreads the planner reads apart (NaN where the run cannot show one): between all ranks (`all`); between
    the ranks of one host (`in_node`: a GPU's, over the hosts that hold two or more); between hosts, each host's
    ranks together (`across_nodes`: a node's, where the run spans hosts)."""
    ranks = len(joined_by_rank)
    by_host = [[r for r in range(ranks) if hosts[r] == h] for h in dict.fromkeys(hosts)] if len(hosts) == ranks else []
    by_host = by_host or [list(range(ranks))]
    return {
        "all": spread(joined_by_rank),
        "in_node": spread_within(joined_by_rank, by_host),
        "across_nodes": spread(joined_by_rank, by_host),
    }


def named(ranks: Sequence[int], host: str | None, on: str = "on") -> str:
    """ "rank 3", "ranks 2, 3", with " on HOST" where the run spans hosts: how every line names a straggler."""
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
    return who + (f" {on} {host}" if host else "")


@dataclass(frozen=True)
class Straggler:
    """A chronic straggler: one rank, or the ranks of one host together."""

    ranks: tuple[int, ...]
    host: str | None  # where the ranks ran, where the run spans hosts
    last_share: float  # the share of steps it (one of them) joined last
    slower: float  # its median join time over the others' median, minus 1
    steps: int  # the steps this was judged over

    def who(self) -> str:
        return named(self.ranks, self.host)

    def line(self, window: str, measure: str = " (time to join the all-reduce)") -> str:
        """What it is, over `window` (the log's "the last 200 steps", the summary's "the steps")."""
        return (
            f"{self.who()}: slowest in {self.last_share:.0%} of {window}, its median step {self.slower:.0%} "
            f"above the others'{measure}"
        )

    def to_json(self) -> dict:
        return {
            "ranks": list(self.ranks),
            "host": self.host,
            "last_share": round(self.last_share, 4),
            "slower": round(self.slower, 4),
        }


def judge(
    last_share: Sequence[float],
    joined_median: Sequence[float],
    joined_mad: Sequence[float],
    hosts: Sequence[str],
    steps: int,
) -> tuple[str, Straggler | None]:
    """("chronic", who); ("noise", None): a different slowest rank from step to step, or one that is last often
    but not later than noise or MIN_GAP; ("unmeasured", None): one rank, or no join times. A host's ranks together
    first (where the run spans hosts and one holds several ranks), then single ranks. `steps`: how many steps the
    figures are over (a median's noise shrinks with them)."""
    ranks = len(last_share)
    if ranks < 2 or any(v != v for v in (*last_share, *joined_median)):
        return "unmeasured", None
    spans_hosts = len(hosts) == ranks and len(set(hosts)) > 1
    groups: list[tuple[int, ...]] = []
    if spans_hosts:
        for host in dict.fromkeys(hosts):
            members = tuple(r for r in range(ranks) if hosts[r] == host)
            if 1 < len(members) < ranks:
                groups.append(members)
    groups += [(r,) for r in range(ranks)]
    units = len(set(hosts)) if spans_hosts else ranks
    for group in groups:
        share = sum(last_share[r] for r in group)
        if share < chronic_share(units if len(group) > 1 else ranks):
            continue
        others = [r for r in range(ranks) if r not in group]
        theirs = statistics.median(joined_median[r] for r in others)
        spreads = [m for m in joined_mad if m == m]
        noise = NOISE_SES * MAD_TO_SE * statistics.median(spreads) / math.sqrt(max(1, steps)) if spreads else 0.0
        mine = min(joined_median[r] for r in group)
        if theirs > 0 and mine - theirs > max(noise, MIN_GAP * theirs):
            where = hosts[group[0]] if spans_hosts else None
            return "chronic", Straggler(group, where, share, mine / theirs - 1, steps)
    return "noise", None


class Window:
    """The last WINDOW_STEPS steps' join times of every rank (rank 0 keeps it): judged after each epoch, the
    line said the first time a straggler is named, and again only when another one is."""

    def __init__(self, hosts: Sequence[str], steps: int = WINDOW_STEPS):
        self.hosts = list(hosts)
        self.rows: deque[list[float]] = deque(maxlen=steps)  # one per step: each rank's join time
        self.named: tuple[int, ...] | None = None

    def add(self, joined_by_rank: Sequence[Sequence[float]]) -> Straggler | None:
        """An epoch's join times, by rank; the straggler to name now, if there is a new one."""
        for column in zip(*joined_by_rank, strict=True):
            if all(v == v for v in column):
                self.rows.append(list(column))
        if len(self.rows) < MIN_STEPS:
            return None
        by_rank = [list(r) for r in zip(*self.rows, strict=True)]
        last = last_to_join(by_rank)
        figures = [clock_figures([], by_rank[r], last[r]) for r in range(len(by_rank))]
        verdict, who = judge(
            [f["last_share"] for f in figures],
            [f["joined_median_s"] for f in figures],
            [f["joined_mad_s"] for f in figures],
            self.hosts,
            len(self.rows),
        )
        if verdict != "chronic" or who is None or who.ranks == self.named:
            return None
        self.named = who.ranks
        return who


def run_verdict(
    per_rank_epochs: Sequence[Mapping[str, Sequence[float | None]]],
    hosts: Sequence[str],
    spreads: Mapping[str, Sequence[float | None]] | None = None,
    steps: int = 1,
) -> dict:
    """summary.json's `stragglers`: the rule over the run's epochs (each epoch's per-rank figures, as
    metrics.jsonl holds them): shares averaged, medians and spreads the median of the epochs'; and the spreads
    between ranks (`spreads`: each epoch's, by the names of `spreads()`), the median of the epochs', for the
    planner."""

    def column(name: str) -> list[float]:
        rows = [e[name] for e in per_rank_epochs if name in e]
        ranks = len(rows[0]) if rows else 0
        out = []
        for r in range(ranks):
            values = [float(v) for row in rows if r < len(row) and (v := row[r]) is not None and v == v]
            out.append(ACROSS_EPOCHS[name](values) if values else float("nan"))
        return out

    def across_epochs(name: str) -> float | None:
        measured = [float(v) for v in (spreads or {}).get(name, ()) if v is not None and v == v]
        return round(statistics.median(measured), 5) if measured else None

    share = column("last_share")
    verdict, who = judge(share, column("joined_median_s"), column("joined_mad_s"), hosts, steps)
    if verdict != "unmeasured" and steps < MIN_STEPS:  # as the live window: too few steps say nothing
        verdict, who, said = "unmeasured", None, f"not judged: {steps} steps, under the {MIN_STEPS} it takes"
    elif who is not None:
        said = who.line("the steps", measure="")
    elif verdict == "noise":
        said = "no rank was chronically slowest (a different one from step to step): noise, no straggler"
    else:
        said = "not measured (one rank, or no DDP all-reduce to time)"
    return {
        "verdict": verdict,
        "spread_cv": across_epochs("all"),
        "spread_cv_in_node": across_epochs("in_node"),
        "spread_cv_across_nodes": across_epochs("across_nodes"),
        "straggler": who.to_json() if who is not None else None,
        "last_share": [round(s, 4) if s == s else None for s in share],
        "said": said,
    }
