"""What a machine should run, and a check that a suite's skips kept to it.

A test that needs more than Python and torch (root with `ip` and `tc`, a Slurm, Ray, MLflow, Chromium, CIFAR-10,
the linters) skips through `skip` or `importorskip` here, its reason tagged with its tier ("[root] ..."). A skip
is right where the machine lacks the tier and wrong where it has it: CI as root with `ip` and `tc` must never skip
a test-cluster test, and one whose extras installed must never skip an MLflow or Ray test. scripts/test.sh records
every pass (DDPLAB_TEST_RECORD: the conftest plugin appends each pass's outcomes there) and ends with

    python tests/support/tiers.py RECORD

which fails on a tagged skip of a tier this machine has, prints the tiers that ran and which did not (and why),
and closes on the suite's totals over every pass ("suite: N passed, N failed, N skipped").
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def _root_with_ip_and_tc() -> str | None:
    if os.geteuid() != 0:
        return "not root"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    return f"no {' or '.join(missing)}" if missing else None


def _slurm() -> str | None:
    from support.slurm_cluster import why_not  # the Slurm tests' own check

    return why_not()


def _module(*names: str) -> Callable[[], str | None]:
    def missing() -> str | None:
        gone = [n for n in names if importlib.util.find_spec(n) is None]
        return f"{', '.join(gone)} not installed" if gone else None

    return missing


def browser() -> str | None:
    """The headless Chromium the browser test drives (None: none installed)."""
    return next((found for name in BROWSERS if (found := shutil.which(name))), None)


def _browser() -> str | None:
    return None if browser() else "no headless Chromium"


def _cifar() -> str | None:
    from support.readers import cifar10_root

    return None if cifar10_root() is not None else "no CIFAR-10 under $DDPLAB_DATA or ../shared/data/cifar10-jpeg"


@dataclass(frozen=True)
class Tier:
    what: str
    lacks: Callable[[], str | None]  # why this machine cannot run it (None: it can, so none of its tests may skip)


TIERS = {
    "root": Tier("the test cluster's hosts and links, a small tmpfs (root, ip, tc)", _root_with_ip_and_tc),
    "slurm": Tier("a one-node Slurm (slurm-wlm, munge, root)", _slurm),
    "ray": Tier("Ray (the ray extra)", _module("ray")),
    "mlflow": Tier("MLflow (the mlflow extra)", _module("mlflow")),
    "browser": Tier("headless Chromium", _browser),
    "cifar10": Tier("CIFAR-10", _cifar),
    "lint": Tier("ruff and mypy (the test extra)", _module("ruff", "mypy")),
}


def tagged(tier: str, why: str) -> str:
    assert tier in TIERS, tier
    return f"[{tier}] {why}"


def skip(tier: str, why: str):
    """pytest.skip, the reason tagged with the tier the machine lacks."""
    pytest.skip(tagged(tier, why))


def skipif(tier: str, why: str | None):
    """A skipif mark for a whole module or test: skipped, tagged, where `why` says the tier is missing."""
    return pytest.mark.skipif(why is not None, reason=tagged(tier, why or ""))


def importorskip(tier: str, module: str, why: str):
    """pytest.importorskip, its reason tagged."""
    return pytest.importorskip(module, reason=tagged(tier, why))


def tier_of(reason: str) -> str | None:
    """The tier a skip's reason is tagged with (None: untagged, a skip no machine fact decides here)."""
    if reason.startswith("[") and "]" in reason:
        name = reason[1 : reason.index("]")]
        return name if name in TIERS else None
    return None


def check(record: Path) -> int:
    """Read every pass's outcomes; 1 (each named) where a tier this machine has was skipped, else 0. Prints the
    tiers that ran and the suite's totals last."""
    passes = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    skipped = [s for p in passes for s in p["skipped"]]
    lacking = {name: tier.lacks() for name, tier in TIERS.items()}
    wrong = [s for s in skipped if (t := tier_of(s["reason"])) is not None and lacking[t] is None]
    status = 0
    if wrong:
        status = 1
        print(f"tiers: {len(wrong)} test(s) skipped a tier this machine has (an install that failed? a test's check?):")
        for s in wrong:
            print(f"  {s['nodeid']}: {s['reason']}")
    if not passes:
        status = 1
        print("tiers: no pass recorded anything: no test ran")
    ran = [f"{p['name']} ({p['passed']} passed)" for p in passes]
    print("tiers: passes " + ", ".join(ran))
    print(
        "tiers: "
        + "; ".join(f"{name} ran" if why is None else f"{name} not here ({why})" for name, why in lacking.items())
    )
    totals = {k: sum(p[k] for p in passes) for k in ("passed", "failed", "errors")}
    print(f"suite: {totals['passed']} passed, {totals['failed'] + totals['errors']} failed, {len(skipped)} skipped")
    return status


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: where `support` is, as pytest has it
    sys.exit(check(Path(sys.argv[1])))
