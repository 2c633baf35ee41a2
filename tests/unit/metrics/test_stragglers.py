"""Who is slow: the rule that names a chronic straggler (a rank, or a host's ranks), says noise as noise, and
the per-rank figures it reads; the step clocks that feed it (CPU: the host's clock)."""

import math

import pytest
import torch

from ddplab.engine.clocks import StepClocks
from ddplab.metrics.stragglers import (
    Window,
    chronic_share,
    clock_figures,
    judge,
    last_to_join,
    run_verdict,
    spreads,
    waits,
)


def steps(*offsets: float, n: int = 100, jitter: float = 0.0005) -> list[list[float]]:
    """Join times for each rank over `n` steps: rank r's offset, with a small deterministic wobble."""
    return [[o + jitter * ((i * 7 + r * 3) % 5 - 2) for i in range(n)] for r, o in enumerate(offsets)]


def test_the_last_to_join_is_one_rank_a_step_and_ties_go_to_the_lowest():
    assert last_to_join([[1.0, 2.0, 3.0], [2.0, 2.0, 1.0]]) == [[False, True, True], [True, False, False]]
    assert last_to_join([[1.0, math.nan], [0.5, 9.0]]) == [[True, False], [False, False]]  # a NaN step: no one
    assert last_to_join([[1.0, 2.0]]) == [[False, False]]  # one rank joins no one's collective


def test_a_ranks_figures_are_its_medians_spread_and_share():
    f = clock_figures(
        [0.01, 0.03, 0.02, 0.05],
        [0.004, 0.006, 0.005, 0.009],
        [True, False, True, True],
        data_s=[0.002, 0.001, 0.004, 0.003],
        waited_s=[0.0, 0.003, 0.0, math.nan],
    )
    assert f["step_median_s"] == pytest.approx(0.025) and f["step_max_s"] == 0.05 and f["step_p95_s"] == 0.05
    assert (f["data_median_s"], f["data_p95_s"], f["data_max_s"]) == (pytest.approx(0.0025), 0.004, 0.004)
    assert (f["waited_median_s"], f["waited_max_s"]) == (0.0, 0.003)  # a step with no join time: left out
    assert f["joined_median_s"] == pytest.approx(0.0055) and f["joined_mad_s"] == pytest.approx(0.001)
    assert f["last_share"] == 0.75
    assert all(math.isnan(v) for v in clock_figures([], [], []).values())


def test_a_rank_slower_every_step_is_named_with_its_share_and_gap():
    joined = steps(0.010, 0.010, 0.0125, 0.010)
    last = last_to_join(joined)
    figures = [clock_figures([], joined[r], last[r]) for r in range(4)]
    verdict, who = judge(
        [f["last_share"] for f in figures],
        [f["joined_median_s"] for f in figures],
        [f["joined_mad_s"] for f in figures],
        ["", "", "", ""],
        100,
    )
    assert verdict == "chronic" and who is not None and who.ranks == (2,) and who.host is None
    assert who.last_share == 1.0 and who.slower == pytest.approx(0.25)
    assert who.line("the last 100 steps") == (
        "rank 2: slowest in 100% of the last 100 steps, its median step 25% above the others' "
        "(time to join the all-reduce)"
    )


def test_ranks_of_equal_speed_name_no_one():
    verdict, who = judge([0.26, 0.24, 0.25, 0.25], [0.010, 0.0101, 0.0099, 0.010], [0.001] * 4, [""] * 4, 100)
    assert (verdict, who) == ("noise", None)
    # last in most steps, but by less than the others' noise: still no one
    assert judge([0.9, 0.1], [0.0102, 0.0100], [0.001, 0.001], ["", ""], 100) == ("noise", None)  # under MIN_GAP
    # 0.0015 s later in 90% of the steps: beyond MIN_GAP; beyond the medians' noise over 400 steps, not over 20
    assert judge([0.9, 0.1], [0.0115, 0.0100], [0.002, 0.002], ["", ""], 400)[0] == "chronic"
    assert judge([0.9, 0.1], [0.0115, 0.0100], [0.002, 0.002], ["", ""], 20) == ("noise", None)
    assert judge([1.0], [0.01], [0.0], [""], 100) == ("unmeasured", None)
    assert judge([math.nan, math.nan], [math.nan, math.nan], [math.nan, math.nan], ["", ""], 100)[0] == "unmeasured"


def test_a_hosts_ranks_late_together_are_named_as_the_host():
    hosts = ["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"]
    verdict, who = judge([0.05, 0.05, 0.5, 0.4], [0.010, 0.010, 0.013, 0.013], [0.0005] * 4, hosts, 100)
    assert verdict == "chronic" and who is not None and who.ranks == (2, 3) and who.host == "10.0.0.2"
    assert who.who() == "ranks 2, 3 on 10.0.0.2" and who.last_share == pytest.approx(0.9)
    # one rank of a host slow alone: that rank, with its host
    verdict, who = judge([0.05, 0.05, 0.85, 0.05], [0.010, 0.010, 0.013, 0.010], [0.0005] * 4, hosts, 100)
    assert who is not None and who.who() == "rank 2 on 10.0.0.2"


def test_the_share_needed_is_most_steps_and_above_chance():
    assert chronic_share(2) == 0.75 and chronic_share(3) == 0.5 and chronic_share(8) == 0.5


def test_the_window_names_a_straggler_once_and_again_only_when_another_one_shows():
    window = Window(["", ""], steps=50)
    assert window.add(steps(0.010, 0.013, n=10)) is None  # too few steps to say anything
    first = window.add(steps(0.010, 0.013, n=30))
    assert first is not None and first.ranks == (1,) and first.steps == 40
    assert window.add(steps(0.010, 0.013, n=30)) is None  # already said
    assert window.add(steps(0.013, 0.010, n=30)) is None  # the window (50 steps) still holds the old ones
    turned = window.add(steps(0.013, 0.010, n=30))
    assert turned is not None and turned.ranks == (0,) and turned.steps == 50


def test_the_runs_verdict_reads_its_epochs_as_metrics_jsonl_holds_them():
    epochs = [
        {"last_share": [0.1, 0.9], "joined_median_s": [0.010, 0.013], "joined_mad_s": [0.0005, 0.0005]},
        {"last_share": [0.0, 1.0], "joined_median_s": [0.010, 0.014], "joined_mad_s": [0.0005, 0.0004]},
        {"cpu_s": [1.0, 1.0]},  # an epoch from before the clocks: left out
    ]
    verdict = run_verdict(epochs, ["", ""], steps=64)
    assert verdict["verdict"] == "chronic" and verdict["straggler"]["ranks"] == [1]
    assert verdict["last_share"] == [0.05, 0.95]
    assert verdict["said"].startswith("rank 1: slowest in 95% of the steps")
    assert run_verdict([{"cpu_s": [1.0]}], [""])["verdict"] == "unmeasured"
    short = run_verdict(epochs, ["", ""], steps=16)  # as the live window: under 20 steps, nobody is named
    assert (short["verdict"], short["straggler"]) == ("unmeasured", None)
    assert short["said"] == "not judged: 16 steps, under the 20 it takes" and short["last_share"] == [0.05, 0.95]


@pytest.mark.parametrize("device", ["cpu"])  # CUDA: events (engine/clocks.py), checked on a GPU machine
def test_the_step_clocks_count_a_ranks_work_from_the_last_release_to_its_next_join(device):
    clocks = StepClocks(torch.device(device))
    clocks.joined()  # outside a step (the communication probe): not counted
    for _ in range(3):
        clocks.begin()
        clocks.fed()
        clocks.fed()  # a second call in a step: the first one counts
        clocks.joined()
        clocks.joined()  # the step's later buckets: the first one counts
        clocks.released()
        clocks.end()
    clocks.begin()
    clocks.end()  # a step that was not fed and joined no all-reduce
    marks = [list(m) for m in clocks.marks]
    step_s, joined_s, data_s = clocks.take()
    assert step_s == [end - begin for begin, _, _, _, end in marks]
    assert data_s[:3] == [fed - begin for begin, fed, *_ in marks[:3]] and all(d > 0 for d in data_s[:3])
    assert joined_s[0] == marks[0][2] - marks[0][0]  # an epoch's first step: from its own start
    assert joined_s[1:3] == [marks[i][2] - marks[i - 1][3] for i in (1, 2)]  # from the previous release
    assert math.isnan(joined_s[3]) and math.isnan(data_s[3]) and clocks.take() == ([], [], [])


def test_each_rank_waits_in_the_all_reduce_for_the_last_one_to_join():
    w = waits([[0.010, 0.020], [0.013, 0.015], [0.011, math.nan]])
    assert w[0][0] == pytest.approx(0.003) and w[1][0] == 0.0 and w[2][0] == pytest.approx(0.002)
    assert all(math.isnan(row[1]) for row in w)  # a step where a rank has no join time: no one's wait
    assert all(math.isnan(v) for v in waits([[0.01, 0.02]])[0])  # one rank waits for no one


def test_the_spread_between_ranks_leaves_out_a_ranks_steady_offset():
    from ddplab.metrics.stragglers import spread

    d = 0.001
    swinging = [[0.010 + d, 0.010 - d] * 10, [0.010 - d, 0.010 + d] * 10]  # each step one early, one late
    assert spread(swinging) == pytest.approx(math.sqrt(2) * d / 0.010)
    assert spread([[0.010] * 20, [0.014] * 20]) == 0.0  # a slow rank is who, not noise
    assert math.isnan(spread([[0.010] * 20])) and math.isnan(spread([[math.nan] * 3, [math.nan] * 3]))


def test_the_spread_in_a_node_and_across_nodes_are_read_apart():
    """Two hosts of two ranks: within each host the ranks swing against each other by d; the hosts swing against
    each other by D (both ranks of a host together). In-node sees d alone, across-nodes D net of the share of the
    ranks' own spread a host's mean would carry; ranks of independent noise on two hosts show no node spread."""
    d, D, n = 0.0005, 0.002, 20
    sign = [1 if i % 2 else -1 for i in range(n)]
    joined = [
        [0.010 + D * s + d * s for s in sign],
        [0.010 + D * s - d * s for s in sign],
        [0.010 - D * s + d * s for s in sign],
        [0.010 - D * s - d * s for s in sign],
    ]
    found = spreads(joined, ["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"])
    assert found["in_node"] == pytest.approx(math.sqrt(2) * d / 0.010)
    # the hosts' means here hold none of d, but were the ranks' swings independent they would hold d^2 / 2 of
    # variance, which is taken out: sqrt(2 D^2 - d^2)
    assert found["across_nodes"] == pytest.approx(math.sqrt(2 * D**2 - d**2) / 0.010)
    assert found["all"] > found["in_node"]
    one_node = spreads(joined, [""] * 4)  # one node (no hosts recorded): all ranks are one node's
    assert one_node["in_node"] == one_node["all"] and math.isnan(one_node["across_nodes"])
    apart = spreads(joined[:2], ["10.0.0.1", "10.0.0.2"])  # a rank a node: no node holds two
    assert math.isnan(apart["in_node"]) and apart["across_nodes"] == apart["all"]


def test_the_runs_verdict_keeps_each_spread_as_the_median_of_its_epochs():
    epochs = [{"last_share": [0.5, 0.5], "joined_median_s": [0.01, 0.01], "joined_mad_s": [0.001, 0.001]}] * 3
    verdict = run_verdict(
        epochs, ["a", "b"], {"all": [0.02, 0.04, 0.03], "in_node": [None] * 3, "across_nodes": [0.03, None, 0.05]}
    )
    assert (verdict["spread_cv"], verdict["spread_cv_in_node"], verdict["spread_cv_across_nodes"]) == (
        0.03,
        None,
        0.04,
    )


def test_independent_ranks_on_two_hosts_show_no_spread_between_the_hosts():
    """Every rank its own noise, nothing shared by a host: the hosts' spread is the noise a mean of two carries,
    taken out, so a node's spread comes out near none while a GPU's is the noise's (the planner adds both)."""
    import random

    rng = random.Random(7)
    joined = [[0.010 + rng.gauss(0, 0.0005) for _ in range(400)] for _ in range(4)]
    found = spreads(joined, ["a", "a", "b", "b"])
    assert found["in_node"] == pytest.approx(0.05, rel=0.25)
    assert found["across_nodes"] < 0.25 * found["in_node"], found
