"""Interconnects as an all-reduce cost model: published figures, and measurements taken here.

An all-reduce of S bytes over N ranks is modelled as

    t(S, N) = alpha + S * 2(N-1)/N / busbw

alpha (s) is the fixed cost of one collective: launch, synchronization, the latency of the
ring's 2(N-1) steps at small sizes. busbw (bytes/s) is the bus bandwidth as nccl-tests
defines it (NVIDIA/nccl-tests, doc/PERFORMANCE.md): the algorithm bandwidth S/t times
2(N-1)/N, the share of S a ring all-reduce sends through each rank's link, so that one
figure describes a link whatever N is. It is the figure to compare with a link's speed.

ddplab/launch/allreduce.py times all-reduce over message sizes on this machine with a real backend (Gloo or
NCCL), in N processes started by PyTorch's elastic launcher, as training's workers are; each
size's time is the slowest rank's. A links file holds one such measurement per number of
ranks (`MeasuredLinks`): on a machine with fewer cores than ranks, alpha grows with N. `fit`
finds alpha and busbw by least squares on relative error: the sizes span five orders of
magnitude, and plain least squares would fit only the largest. The fit's error (median and
worst relative error over the sizes) says how far the model can be trusted for that link.

`CLASSES` holds what each class of link was published reaching: where public measurements exist
(nccl-tests) what they reached, else the specification's line rate, said so. The published
sources the planner is checked against and a plan (`PUBLISHED`: the names --link takes) read the
same figures. They are marked published, not measured: a run gets at most that.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ddplab.errors import ConfigError, DataError
from ddplab.io.borders import COUNT, SECONDS, TABLE, TEXT, check, list_of, number, whole
from ddplab.rundir import runfiles

GB = 1e9  # bandwidths are in GB/s (10^9 bytes per second), as nccl-tests and the specifications give them
KIB, MIB = 2**10, 2**20
SIZES = tuple(4 * KIB * 4**i for i in range(10))  # 4 KiB .. 1 GiB by 4x; `measure` stops at its max_bytes
MAX_BYTES = 256 * MIB


@dataclass(frozen=True)
class Link:
    name: str
    busbw_gbps: float  # GB/s per rank's link, one direction
    alpha_s: float  # s per collective
    source: str  # where the figures come from
    measured: bool = False
    fit_error: dict[str, float] = field(default_factory=dict)  # measured: median and max relative error
    ranks: int = 0  # measured with this many ranks (0: published figures)

    def allreduce_s(self, size_bytes: float, ranks: int) -> float:
        """Modelled time of one all-reduce of `size_bytes` over `ranks` (0 for one rank: nothing to reduce)."""
        if ranks <= 1:
            return 0.0
        return self.alpha_s + size_bytes * 2 * (ranks - 1) / ranks / (self.busbw_gbps * GB)

    def for_ranks(self, ranks: int) -> Link:
        """The figures for an all-reduce over `ranks`: a published link has one set."""
        return self


@dataclass(frozen=True)
class MeasuredLinks:
    """This machine's all-reduce, fitted once per number of ranks measured (a links file).

    Ranks that share cores wait for each other in every step of the ring: on a 2-core VM,
    alpha was 1.2 ms with 2 ranks and 5.2 ms with 4 (BENCHMARKS.md). A prediction for N
    ranks uses the fit with N, else the nearest with more, else the one with the most.
    """

    links: tuple[Link, ...]  # ascending ranks

    def for_ranks(self, ranks: int) -> Link:
        return next((link for link in self.links if link.ranks >= ranks), self.links[-1])

    @property
    def ranks(self) -> list[int]:
        return [link.ranks for link in self.links]


GBIT = 1 / 8  # GB/s per Gbit/s

# The link classes a published source (planner/figures) or a plan (PUBLISHED) can name: the all-reduce bus
# bandwidth NCCL reached on that class at large messages, as published by people who measured it (nccl-tests busbw),
# a GPU's (inside a node) or a port's (between nodes); where no measurement was found, the specification's line rate
# a direction, said so (LINE_RATE). alpha assumed where not said. "unknown" (in a source): the source does not say
# (its points are not predicted). Measured figures read 2026-12-03.
AT_LINE = "taken at its line rate"  # the mark of a class whose figure is its line rate (AT_LINE_RATE)
LINE_RATE = f"{AT_LINE}: no published NCCL all_reduce figure found for this class"
CLASSES: dict[str, Link] = {
    link.name: link
    for link in (
        Link("pcie3", 15.75, 10e-6, f"PCIe 3.0 x16: 8 GT/s a lane, ~15.75 GB/s a direction (PCI-SIG); {LINE_RATE}"),
        Link(
            "pcie4",
            20.0,
            10e-6,
            "PCIe 4.0 x16 (~31.5 GB/s a direction, PCI-SIG): one published figure, all_reduce busbw ~20 GB/s on A100 "
            "PCIe where the ring crosses PCIe (3 GPUs; NVIDIA/nccl-tests#178, the reporter's text, 2023-11-17)",
        ),
        Link(
            "pcie5",
            38.5,
            10e-6,
            "PCIe 5.0 x16 (~63 GB/s a direction, PCI-SIG): all_reduce busbw 38.5 GB/s, the median of six published "
            "figures at 128 MB and up, 28 to 41.7: 28 on 8 and 35 on 4 RTX 5090 (NVIDIA/nccl#1639, 2025-03-14, "
            "called healthy for PCIe by NCCL's maintainer), 37.6 to 41.7 on 7-8 RTX PRO 6000 Blackwell from four "
            "owners (github voipmonitor/rtx6kpro hardware/pcie-bandwidth.md)",
        ),
        Link("nvlink1", 80.0, 10e-6, f"NVLink 1 on P100 SXM2: 4 x 20 GB/s a direction (P100 datasheet); {LINE_RATE}"),
        Link("nvlink2", 150.0, 10e-6, f"NVLink 2 on V100 SXM2: 6 x 25 GB/s a direction (V100 datasheet); {LINE_RATE}"),
        Link(
            "nvlink3",
            231.6,
            10e-6,
            "NVLink 3 on A100 SXM4, 8 GPUs on NVSwitch: nccl-tests all_reduce busbw 231.58 GB/s at 8 GB (Azure ND A100 "
            "v4, github.com/Azure/AI-benchmarking-guide Azure_Results/ND_A100_v4_results.md; AWS p4dn 230.77 at 1 GB, "
            "NVIDIA/nccl#527); line rate 300",
        ),
        Link(
            "nvlink4",
            450.0,
            26e-6,
            "NVLink 4 on H100/H200 SXM: line rate 450 GB/s a direction (H100 and H200 datasheets), which the published "
            "figures bracket: ring busbw 365-370 at 2-8 GPUs, NVLink SHARP 480 at 8 (NVIDIA/nccl#1455, "
            "nccl-tests#212); nccl-tests all_reduce on 8x H100 takes ~26 us at the smallest sizes",
        ),
        Link(
            "nvlink5",
            900.0,
            10e-6,
            "NVLink 5 on B200: line rate 900 GB/s a direction (B200 datasheet); published: 830+ on 8 B200 "
            "(NVIDIA/nccl#1807, text only), ring 679.6 on 4 GB200 (Azure ND GB200 v6)",
        ),
        Link(
            "nvlink-bridge",
            56.25,
            10e-6,
            f"NVLink bridge on RTX 3090: 112.5 GB/s both directions (NVIDIA); {LINE_RATE}",
        ),
        Link("eth-1g", 1 * GBIT, 50e-6, f"1 Gigabit Ethernet (IEEE 802.3); {LINE_RATE}"),
        Link("eth-10g", 10 * GBIT, 50e-6, f"10 Gigabit Ethernet (IEEE 802.3ae); {LINE_RATE}"),
        Link(
            "eth-25g",
            1.7,
            50e-6,
            "25 Gigabit Ethernet (IEEE 802.3by; 3.125 GB/s line) over NCCL's TCP sockets: all_reduce busbw 1.7 GB/s at "
            "large sizes, 2 nodes x 4 V100 PCIe on Azure, ring, NCCL 2.9.6 (NVIDIA/nccl-tests#83, 2021-05-11)",
        ),
        Link("eth-40g", 40 * GBIT, 50e-6, f"40 Gigabit Ethernet (IEEE 802.3ba); {LINE_RATE}"),
        Link("eth-50g", 50 * GBIT, 50e-6, f"50 Gigabit Ethernet (IEEE 802.3cd); {LINE_RATE}"),
        Link(
            "eth-100g",
            100 * GBIT,
            50e-6,
            f"100 Gigabit Ethernet (IEEE 802.3ba), {AT_LINE}: published 4-6 GB/s over TCP sockets (4 nodes x 8 "
            "V100, NVIDIA/nccl#450), about 10 with AWS EFA on 2 nodes (NVIDIA/nccl#235): which one a source's runs "
            "used is not stated",
        ),
        Link("roce-25g", 25 * GBIT, 10e-6, f"25 Gbit/s RoCE; {LINE_RATE}"),
        Link("roce-100g", 100 * GBIT, 10e-6, f"100 Gbit/s RoCE; {LINE_RATE}"),
        Link(
            "ib-fdr", 56 * GBIT, 5e-6, f"FDR InfiniBand: 56 Gbit/s a port (InfiniBand Trade Association); {LINE_RATE}"
        ),
        Link(
            "ib-edr",
            12.0,
            5e-6,
            "EDR InfiniBand, 100 Gbit/s a port (12.5 GB/s line): NCCL's maintainers give 12 GB/s a 100G NIC "
            "(NVIDIA/nccl-tests#119)",
        ),
        Link("ib-hdr100", 12.0, 5e-6, "HDR100 InfiniBand, 100 Gbit/s a port: 12 GB/s a 100G NIC (nccl-tests#119)"),
        Link(
            "ib-hdr",
            24.0,
            5e-6,
            "HDR InfiniBand, 200 Gbit/s a port (25 GB/s line): 24 GB/s a 200G NIC (NCCL's maintainers, "
            "nccl-tests#119, where 3 nodes of 4 HDR NICs reach 96.45 GB/s)",
        ),
        Link("ib-ndr200", 24.0, 5e-6, "NDR200 InfiniBand, 200 Gbit/s a port: 24 GB/s a 200G NIC (nccl-tests#119)"),
        Link(
            "ib-ndr",
            47.0,
            5e-6,
            "NDR InfiniBand, 400 Gbit/s a port (50 GB/s line): 46-48 GB/s a NIC (NCCL's maintainers, nccl-tests#290)",
        ),
        Link("opa-100", 100 * GBIT, 5e-6, f"Omni-Path 100: 100 Gbit/s a port (Intel); {LINE_RATE}"),
        Link("aries", 10.0, 5e-6, f"Cray Aries: ~10 GB/s a node's injection bandwidth (Cray XC series); {LINE_RATE}"),
        Link("slingshot", 200 * GBIT, 5e-6, f"HPE Slingshot 11: 200 Gbit/s a NIC (HPE Cray EX); {LINE_RATE}"),
    )
}

# The links a plan names (--link, --inter-link), each a class above: one figure per class, whoever reads it.
PLAN_NAMES = {
    "nvlink": "nvlink4",
    "pcie5": "pcie5",
    "pcie4": "pcie4",
    "ib": "ib-ndr",
    "100gbe": "eth-100g",
    "25gbe": "eth-25g",
    "10gbe": "eth-10g",
}
PUBLISHED: dict[str, Link] = {name: replace(CLASSES[c], name=name) for name, c in PLAN_NAMES.items()}

# The plan's links taken at their line rate (no NCCL all-reduce figure found for the class), which NCCL may run far
# under: over TCP the planner's test sources did (BENCHMARKS.md, "The model on two sources kept out of every fit and
# band").
AT_LINE_RATE = frozenset(name for name, link in PUBLISHED.items() if AT_LINE in link.source)


def link_named(name: str) -> Link:
    try:
        return PUBLISHED[name]
    except KeyError:
        raise ConfigError(
            f"no link named {name!r}: the links are {', '.join(PUBLISHED)}, measured, or a links file's path (.json)"
        ) from None


def fit(sizes: list[float], times: list[float], ranks: int) -> tuple[float, float, dict[str, float]]:
    """alpha (s), busbw (GB/s) and the fit's relative errors, from all-reduce times over `ranks`.

    Least squares of t = alpha + x / busbw with x = S * 2(N-1)/N, each point weighted by 1/t
    (its relative error). A fit that cannot describe a link (fewer than 3 sizes, a bandwidth
    that is not positive) is a DataError."""
    points = [
        (s * 2 * (ranks - 1) / ranks, t) for s, t in zip(sizes, times, strict=False) if t > 0 and math.isfinite(t)
    ]
    if ranks < 2 or len(points) < 3:
        raise DataError(
            f"an all-reduce fit needs 3 or more sizes timed over 2 or more ranks; got "
            f"{len(points)} size(s) over {ranks} rank(s)"
        )
    w = [1 / t**2 for _, t in points]  # weights of the squared residuals: (residual / t)^2
    sw = sum(w)
    mx = sum(wi * x for wi, (x, _) in zip(w, points, strict=True)) / sw
    mt = sum(wi * t for wi, (_, t) in zip(w, points, strict=True)) / sw
    sxx = sum(wi * (x - mx) ** 2 for wi, (x, _) in zip(w, points, strict=True))
    slope = sum(wi * (x - mx) * (t - mt) for wi, (x, t) in zip(w, points, strict=True)) / sxx if sxx > 0 else 0.0
    alpha = max(mt - slope * mx, 0.0)
    if slope <= 0:
        raise DataError(
            "the all-reduce times do not grow with the message size: the measurement is degenerate "
            "(too noisy, or too few sizes); measure again on an idle machine"
        )
    errors = [abs(alpha + slope * x - t) / t for x, t in points]
    return alpha, 1 / slope / GB, {"median": statistics.median(errors), "max": max(errors)}


def measured_link(result: dict[str, Any]) -> Link:
    """The Link a `measure` result describes."""
    alpha, busbw, error = fit(result["sizes"], result["times_s"], result["ranks"])
    nodes = result.get("nodes", 1)
    where = f" across {nodes} nodes" if nodes > 1 else ""
    return Link(
        f"measured-{result['backend']}",
        busbw,
        alpha,
        f"measured here: {result['backend']} x{result['ranks']} on {result['device']}{where}",
        measured=True,
        fit_error=error,
        ranks=result["ranks"],
    )


def link_record(link: Link) -> dict[str, Any]:
    return asdict(link)


LINKS_FILE = "links.json"  # `ddplab plan --measure`'s output; in a sweep folder, the report's link


def save_links(path: Path, results: list[dict[str, Any]], **extra: Any) -> None:
    """`measure` results (one per number of ranks) and their fitted links, as `ddplab plan --measure` and a sweep
    write them: the first as "measurement" and "link", any others under "more"."""
    from ddplab.io import files

    records = [
        {"measurement": r, "link": link_record(measured_link(r))} for r in sorted(results, key=lambda r: r["ranks"])
    ]
    files.write_json(path, {**records[0], "more": records[1:], **extra})


# What a links file's measurement holds (`measure` writes it); the fitted "link" beside it is fitted again.
MEASUREMENT = {
    "backend": TEXT,
    "ranks": whole(2),
    "nodes": COUNT,
    "device": TEXT,
    "sizes": list_of(number(above=0, most=MAX_BYTES * 16)),
    "times_s": list_of(number(above=0, most=3600)),
    "wall_s": SECONDS,
}


def measurements(path: Path) -> list[dict[str, Any]]:
    """The `measure` results a links file holds (one per number of ranks), checked; one that is not such a file
    is a DataError naming it and the field."""
    data = runfiles.read_json(Path(path), Path(path).parent)
    check(data, {"measurement": TABLE, "more": list_of(TABLE)}, str(path), required=("measurement",))
    found = []
    for i, record in enumerate([data, *data.get("more", [])]):
        where = "measurement" if i == 0 else f"more[{i - 1}].measurement"
        m = check(
            record,
            {"measurement": MEASUREMENT},
            str(path),
            required=tuple(f"measurement.{k}" for k in ("backend", "ranks", "device", "sizes", "times_s")),
        )
        m = m["measurement"]
        if len(m["sizes"]) != len(m["times_s"]):
            raise DataError(f"{path}: {where} times {len(m['times_s'])} sizes but lists {len(m['sizes'])}")
        try:
            measured_link(m)
        except DataError as exc:
            raise DataError(f"{path}: {where}: {exc}") from None
        found.append(m)
    return found


def load_links(path: Path) -> MeasuredLinks:
    """The links a links file describes, fitted again from its measurements."""
    return MeasuredLinks(tuple(sorted(map(measured_link, measurements(path)), key=lambda link: link.ranks)))


def read_links(path: Path, skipped: list[str] | None = None) -> MeasuredLinks | None:
    """The links of a sweep's links file, for the report and the sweep's estimate: None when there is none, or
    when it cannot be read (then why, in `skipped`: it costs the predictions only)."""
    if not Path(path).is_file():
        return None
    try:
        return load_links(path)
    except (OSError, ConfigError, DataError) as exc:
        if skipped is not None:
            skipped.append(f"{exc}: no predictions from it")
        return None
