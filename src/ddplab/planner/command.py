"""What `ddplab plan` prints and writes: a run's prediction (plan.json), the published cases against the
model, the published links, and this machine's all-reduce measured (links.json).

cli/plan.py checks the options against the mode and calls one of these; the model is model.py, the
links links.py, the published cases published.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ddplab.errors import ConfigError, DataError
from ddplab.io import files
from ddplab.planner import links
from ddplab.planner.band import Band, band_for, batch_band, cells_table, unseen_points, unseen_table

if TYPE_CHECKING:
    from ddplab.planner import model
    from ddplab.planner.planfile import Overlapped


def predict_run(
    run_dir: Path,
    *,
    gpus: list[int] | None,
    nodes: list[int],
    batches: list[int] | None,
    link: str | None,
    inter_link: str,
    links_file: Path,
    out: Path | None,
) -> int:
    """A finished run predicted on `gpus` x `nodes` at `batches` over `link`: the table, and plan.json."""
    from ddplab.planner import model
    from ddplab.rundir.runread import finished_run

    run = finished_run(run_dir)
    assert run.summary is not None  # a finished run's
    out = out or Path("plan.json")
    files.ready_to_write(out)
    try:
        costs = model.step_costs(run.summary, run.history, run.config, run.steps)
    except DataError as exc:
        raise DataError(f"{run_dir}: {exc}") from None
    between = measured_or_published(inter_link, links_file) if max(nodes) > 1 else None  # a name given: first
    within = measured_or_published(link or ("nvlink" if costs.on_cuda else "measured"), links_file, given=bool(link))
    per_node = gpus or ([1, 2, 4, 8] if costs.on_cuda else [1, 2])
    grid = model.predict_grid(costs, per_node, nodes, batches or [run.summary["batch"]["local"]], within, between)
    node_gbit = between.busbw_gbps * 8 if isinstance(between, links.Link) else None  # a published link's
    # A measured node of several GPUs: its rows across nodes of as many GPUs a node are planned from a node.
    m = costs.measured
    assert m is not None  # step_costs of a run records what it measured
    one_node = m["nodes"] == 1 and not run.config.get("dist.share_device")  # a GPU a worker
    node = m["per_node"] if one_node and m["per_node"] > 1 else None
    bands: dict[str, Band] = {}  # by letter, in the order the rows first use them
    rows = []
    for planned in grid.rows:
        b, letter = row_band(planned.prediction, costs, node_gbit, node), None
        if b is not None:
            letter = next((k for k, v in bands.items() if v == b), None) or band_name(len(bands))
            bands[letter] = b
        rows.append(
            replace(
                planned, band=b.around(planned.prediction.images_per_s) if b and b.cases else None, band_name=letter
            )
        )
    grid = replace(grid, rows=rows)
    print(
        f"plan for {run_dir}: measured {m['world_size']} worker(s) at local batch {m['local_batch']} on "
        f"{m['device']}, {m['step_s'] * 1e3:,.1f} ms a step; link {link_text(within)}"
        + (f", between nodes {link_text(between)}" if between else "")
    )
    said = m["spread_from"]
    print(
        f"  spread between ranks (STRAGGLER): {'a GPU' if costs.on_cuda else 'a step'}'s {costs.step_cv:.1%}, "
        f"{said['gpu']}" + (f"; a node's {costs.node_cv:.1%}, {said['node']}" if costs.node_cv else "")
    )
    for side, used in (("within a node", within), ("between nodes", between)):
        if isinstance(used, links.Link) and used.name in links.AT_LINE_RATE:
            print(
                f"  note: the link {side}, {used.name}, is taken at its line rate (no published NCCL figure), which "
                "NCCL may run far under: over TCP it did in the planner's test (its predictions up to 4.4x what was "
                "published, BENCHMARKS.md); measure the link on the machine (ddplab plan --measure there) and plan "
                "over that links file"
            )
    print(
        f"  {'workers':>9} {'batch':>6} {'step ms':>9} {'comm ms':>8} {'exposed':>8} {'images/s':>10} "
        f"{'band':>17} {'':9} {'speedup':>8} {'ideal':>6} {'efficiency':>10}"
    )
    for row in rows:
        r, lo_hi = row.prediction, row.band
        used = bands.get(row.band_name) if row.band_name else None
        shown = (
            f"{lo_hi[0]:,.0f}-{lo_hi[1]:,.0f} {row.band_name}" if lo_hi else (f"none {row.band_name}" if used else "")
        )
        print(
            f"  {r.per_node:>3} x {r.nodes:<3} {r.local_batch:>6} {r.step_s * 1e3:>9,.2f} "
            f"{r.comm_s * 1e3:>8,.2f} {r.exposed_comm_s * 1e3:>8,.2f} {r.images_per_s:>10,.0f} "
            f"{shown:>17} {used.mark if used else '':9} {r.speedup:>7.2f}x {r.ideal:>5.0f}x {r.efficiency:>10.0%}"
        )
    for cause in dict.fromkeys(r.above_ideal for r in rows if r.above_ideal):
        print(f"  above the ideal: {cause}")
    empty = [line for r in rows if (line := model.empty_steps(costs, r.prediction))]
    if empty:
        print(
            f"  under the ideal for the dataset's size: an epoch of {costs.train_images:,} images takes whole steps "
            f"({'; '.join(empty)}): a larger dataset or a smaller local batch scales further"
        )
    overlapped = [(r.prediction, rate) for r in rows if (rate := model.overlapped_rate(costs, r.prediction, between))]
    if overlapped:
        faster = ", ".join(f"{p.per_node} x {p.nodes} at {p.local_batch}: {rate:,.0f}" for p, rate in overlapped)
        print(
            "  across nodes on a CPU the whole all-reduce is counted exposed (CPU_SERIAL: this machine's two hosts, "
            "sharing one VM's cores, bear it out); where hosts share no cores the wire's wait runs under backward, "
            f"which would give images/s of {faster}"
        )
    for letter, b in bands.items():
        print(f"  band {letter}: {b.text()}")
    if bands:
        print(
            "  bands: planner/band.py; the published figures' coverage is validation (the model's terms and the "
            "band's rule were chosen looking at them), not a test"
        )
    narrower = from_node_hint([r.prediction for r in rows], costs, node_gbit, node)
    if narrower:
        print(f"  {narrower}")
    for p in grid.pays_from:
        below = " or less (a GPU's step below the measured batch is not known)"
        bars = ", ".join(
            f"{pct}% efficiency from local batch {b}" + (below if costs.on_cuda and b == costs.measured_batch else "")
            if b
            else f"never {pct}% efficient up to local batch 8192"
            for pct, b in p.batch_for.items()
        )
        print(f"  {p.per_node} x {p.nodes}: {bars}")
    unmeasured = sorted(
        {r.prediction.workers for r in rows if r.prediction.workers > max(within.ranks)}
        if isinstance(within, links.MeasuredLinks)
        else set()
    )
    if unmeasured:
        print(
            f"  note: the link was measured with at most {max(within.ranks)} ranks; the rows with "
            f"{', '.join(map(str, unmeasured))} workers use that fit, optimistic where ranks share cores "
            f"(measure with: ddplab plan --measure --nproc {','.join(map(str, [*within.ranks, *unmeasured]))})"
        )
    rates: list[Overlapped] = [
        {"per_node": p.per_node, "nodes": p.nodes, "local_batch": p.local_batch, "images_per_s": rate}
        for p, rate in overlapped
    ]
    files.write_json(out, grid.to_json(run_dir, {name: b.to_json() for name, b in bands.items()}, rates))
    print(f"plan: {out} (assumptions: ddplab/planner/model.py)")
    return 0


def show_corpus() -> int:
    """The model against the published scaling figures of planner/figures, by source and by kind."""
    from ddplab.planner import corpus

    sources, series = corpus.load()
    print(f"published scaling figures: {len(sources)} sources, {len(series)} series (ddplab/planner/figures)")
    plain, held, spreads = corpus.predicted(series)
    print(corpus.table(plain, held, spreads))
    print()
    print(cells_table(held, spreads))
    tested = unseen_table(unseen_points())
    if tested:
        print(f"\n{tested}")
    return 0


def show_published() -> int:
    """Each published case, its stated time against the model's prediction from the hardware it states."""
    from ddplab.planner.model import DDP_HOST_PER_LAYER_S, GPU_STEP_CV, NODE_STEP_CV, ddp_work_s
    from ddplab.planner.published import CASES, implied_ddp_host, predict

    print(
        "published scaling figures, predicted from the hardware they state with a CUDA plan's terms (DDP_HOST, "
        f"HOST_FLOOR, and STRAGGLER at its fitted spreads, a GPU's {GPU_STEP_CV:.2%} and a node's {NODE_STEP_CV:.0%}; "
        "BENCHMARKS.md)"
    )
    for case in CASES:
        print(
            f"{case.name}: {case.source}"
            + (f"; {case.note}" if case.note else "")
            + (f" [not in the error band: {case.not_comparable}]" if case.not_comparable else "")
            + (
                f"; DDP's own work a step (DDP_HOST, {case.layers} layers with parameters): "
                f"{ddp_work_s(case.layers) * 1e3:,.2f} ms"
                if case.layers
                else ""
            )
        )
        for r in predict(case):
            print(
                f"  {r['gpus']:>3} GPU(s) on {r['nodes']} node(s) over {r['link']}: stated {r['stated']:,.3f} s, "
                f"predicted {r['predicted']:,.3f} s ({r['error']:+.0%}), all-reduce left exposed "
                f"{r['exposed_comm_s'] * 1e3:,.2f} ms a step"
                + (
                    f"; unexplained {r['unexplained_s'] * 1e3:,.1f} ms a step (an all-reduce alone would need "
                    f"{r['implied_busbw_gbps']:,.2f} GB/s of bus bandwidth to take it)"
                    if r["implied_busbw_gbps"] is not None
                    else ""
                )
            )
        implied = implied_ddp_host(case) if not case.not_comparable else None
        if implied is not None:
            print(
                f"  DDP_HOST these rows imply, every other term a plan's: {implied * 1e6:,.0f} us a layer (the median "
                f"of the rows'; the model's, measured on one H100: {DDP_HOST_PER_LAYER_S * 1e6:,.0f} us a layer)"
            )
    print(f"error band of GPU predictions on one node at 2 GPUs (ddplab plan RUN): {band_for(True).text()}")
    return 0


def list_links() -> int:
    print(f"{'link':<8} {'bus GB/s':>9} {'alpha us':>9}  source (published, not measured)")
    for link in links.PUBLISHED.values():
        print(f"{link.name:<8} {link.busbw_gbps:>9,.1f} {link.alpha_s * 1e6:>9,.0f}  {link.source}")
    print("measure this machine's: ddplab plan --measure [--backend gloo|nccl] [--nproc N]")
    return 0


def link_text(link) -> str:
    """A link as the plan's header gives it: its figures, measured or published (each fit, for a measured set)."""
    if isinstance(link, links.MeasuredLinks):
        return (
            link.links[0].name
            + " ("
            + "; ".join(f"{k.ranks} ranks {k.busbw_gbps:,.3g} GB/s, {k.alpha_s * 1e6:,.0f} us" for k in link.links)
            + ", measured)"
        )
    return f"{link.name} ({link.busbw_gbps:,.3g} GB/s, {link.alpha_s * 1e6:,.0f} us, published)"


def band_name(i: int) -> str:
    """The i-th band's name in a plan: a, b, ..., z, aa, ab, ..."""
    name = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        name = chr(ord("a") + r) + name
    return name


def row_band(p: model.Prediction, costs: model.StepCosts, node_gbit: float | None, node: int | None) -> Band | None:
    """The band a row carries: its cell's (planner/band.band_for: its kind, count and, on CUDA, its node's network
    and whether it is planned from the measured node of `node` GPUs), times the batch checks' where it is planned
    at another local batch than measured; None for one worker at the measured batch (the run itself)."""
    other = p.local_batch != costs.measured_batch
    if p.workers == 1:
        return batch_band() if other and costs.on_cuda else None
    from_node = planned_from_node(p, node)
    return band_for(costs.on_cuda, p.nodes, other and costs.on_cuda, node_gbit, from_node, p.per_node)


def planned_from_node(p: model.Prediction, node: int | None) -> bool:
    """Whether a row is planned from the measured node of `node` GPUs (None: the run was no such node): a row across
    nodes of as many GPUs a node."""
    return node is not None and p.nodes > 1 and p.per_node == node


def from_node_hint(
    rows: list[model.Prediction], costs: model.StepCosts, node_gbit: float | None, node: int | None
) -> str:
    """What narrows the band of rows across nodes planned from less than a node of several GPUs: the band of the same
    node counts planned from a measured node, which leaves out the node's own step (one GPU to the node: corpus.
    composed_bands); "" where no row is so planned. The cells' bands alone: a row at another local batch carries the
    batch checks' besides."""
    from ddplab.planner import corpus

    if not costs.on_cuda:
        return ""
    counts = {
        corpus.count_bin(p.nodes) for p in rows if p.nodes > 1 and p.per_node > 1 and not planned_from_node(p, node)
    }
    said = []
    for n in sorted(counts):
        b = band_for(True, n, node_gbit=node_gbit, from_node=True)
        if b.cases and "wide" not in b.marks:
            held = f", validation {b.held} of {b.held_of}" if b.held_of else ""
            marked = f" [{b.mark}]" if b.marks else ""
            where = f"at {'up to ' if n > 2 else ''}{n} nodes"
            said.append(f"{where} {b.lo - 1:+.0%} to {b.hi - 1:+.0%} ({b.cases} cases{held}){marked}")
    if not said:
        return ""
    return (
        "narrower across nodes: measure one node of the GPUs a node will have (ddplab train on all of them) and plan "
        f"from that run; so planned, the published runs' band is {', '.join(said)}"
    )


def measured_or_published(name: str, links_file: Path, given: bool = True):
    """A published link by name, this machine's measured one from `links_file` ("measured"; `given`: the user
    named it, rather than the CPU's default, which the error says), or the measured links of a file named by its
    path (one node's measurement in links.json, the nodes' in another: both in one plan)."""
    if name != "measured" and not name.endswith(".json"):
        return links.link_named(name)
    path = links_file if name == "measured" else files.user_path(name)
    if not path.is_file():
        what = "a folder, not a links file" if path.is_dir() else "which does not exist"
        default = "" if given else " (the link within a node on a CPU, unless --link names one)"
        said = f"--link measured{default} reads {path}" if name == "measured" else f"the links file {path}"
        raise ConfigError(
            f"{said}, {what}: measure this machine's link first (ddplab plan "
            "--measure, which writes links.json), give --links-file the file it wrote, or name a published link"
        )
    return links.load_links(path)
