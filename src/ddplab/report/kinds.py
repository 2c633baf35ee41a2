"""The kinds of report section, in one table: whom each compares with whom, which findings answer
it, which tables and plots show it. A sweep file's `[[sections]] kind` names one (sweepdir/spec.py
checks the name against its own list, kept equal to this table by a test); a section without a
known kind is read as "all". A new kind is one row here (and its name in spec.KINDS).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ddplab.report import findings as say
from ddplab.report.records import Section

if TYPE_CHECKING:
    from ddplab.report.findings import Finding


@dataclass(frozen=True)
class SectionKind:
    name: str
    # Whom each point is compared with: "own" (nobody: each answers from its own figures), "baseline" (its
    # nearest declared baseline point; without one, as "every"), "every" (speedups between worker counts, and
    # the points along each axis).
    pairs: str
    speedups: bool  # its declared pairs are speedups (the scaling tables, the ideal)
    overfitting: str  # its overfitting table: "always", "seen" (when a point overfits) or "never"
    plots: frozenset[str]  # beside the curves and the plots any data brings: "speed", "time-breakdown", "step-loss"
    findings: Callable[[Section], list[Finding]]

    @property
    def marks_overfitting(self) -> bool:
        """Its curves mark where each point's test loss turned."""
        return self.overfitting == "always"


KINDS = {
    k.name: k
    for k in (
        SectionKind(
            "all", "every", False, "seen", frozenset({"speed", "time-breakdown", "step-loss"}), say.all_findings
        ),
        SectionKind("run", "own", False, "never", frozenset({"step-loss"}), lambda s: say.run_findings(s.rows)),
        SectionKind("scaling", "baseline", True, "never", frozenset({"speed", "time-breakdown"}), say.scaling_findings),
        SectionKind("overfitting", "own", False, "always", frozenset(), lambda s: say.overfitting_findings(s.rows)),
        SectionKind("regularization", "baseline", False, "always", frozenset({"speed"}), say.regularization_findings),
        SectionKind(
            "compare", "baseline", False, "never", frozenset({"speed"}), lambda s: say.comparison_findings(s.pairs)
        ),
    )
}


def kind_of(section: Section) -> SectionKind:
    return KINDS.get(section.kind, KINDS["all"])


def section_findings(section: Section) -> list[Finding]:
    """The section's answer, in reading order: its kind's findings (report/kinds.py), then what is missing."""
    if not section.rows:
        out = [
            say.Finding(
                "no run of this section finished: nothing to compare (see the runs that did not finish)", "missing"
            )
        ]
        return out + say.not_measured(section)
    return kind_of(section).findings(section) + say.not_measured(section) + say.run_notes(section)
