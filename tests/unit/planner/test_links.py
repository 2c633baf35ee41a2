"""The all-reduce cost model: the fit recovers a link, refuses a degenerate measurement, and a real one fits."""

import json

import pytest

from ddplab.errors import ConfigError, DataError
from ddplab.planner.links import (
    GB,
    PUBLISHED,
    SIZES,
    Link,
    fit,
    link_named,
    load_links,
    read_links,
    save_links,
)


def test_the_fit_recovers_alpha_and_bus_bandwidth_from_exact_times():
    link = Link("x", busbw_gbps=12.5, alpha_s=40e-6, source="test")
    for ranks in (2, 4, 8):
        sizes = list(SIZES[:8])
        alpha, busbw, error = fit(sizes, [link.allreduce_s(s, ranks) for s in sizes], ranks)
        assert alpha == pytest.approx(40e-6, rel=1e-6) and busbw == pytest.approx(12.5, rel=1e-6)
        assert error["max"] < 1e-9


def test_bus_bandwidth_is_the_nccl_tests_figure():
    """busbw = algbw x 2(N-1)/N: 8 ranks reducing 1 GB in 1 s is an algbw of 1 GB/s and a busbw of 1.75 GB/s."""
    link = Link("x", busbw_gbps=1.75, alpha_s=0.0, source="test")
    assert link.allreduce_s(1 * GB, 8) == pytest.approx(1.0)
    assert link.allreduce_s(1 * GB, 1) == 0.0  # one rank reduces nothing


def test_a_noisy_measurement_fits_with_its_error_said():
    link = Link("x", busbw_gbps=2.0, alpha_s=100e-6, source="test")
    sizes = list(SIZES[:9])
    noise = [1.1, 0.9, 1.05, 0.95, 1.1, 0.92, 1.08, 0.97, 1.02]
    alpha, busbw, error = fit(sizes, [link.allreduce_s(s, 2) * n for s, n in zip(sizes, noise, strict=True)], 2)
    assert 1.6 < busbw < 2.4 and 50e-6 < alpha < 150e-6
    assert 0.01 < error["median"] < 0.12 and error["max"] < 0.2


@pytest.mark.parametrize(
    "sizes, times, ranks, says",
    [
        ([4096, 16384], [1e-4, 2e-4], 2, "needs 3 or more sizes"),
        ([4096, 16384, 65536], [1e-4, 2e-4, 3e-4], 1, "over 1 rank"),
        ([4096, 16384, 65536], [3e-4, 2e-4, 1e-4], 2, "do not grow with the message size"),
        ([4096, 16384, 65536], [0.0, float("nan"), 1e-4], 2, "needs 3 or more sizes"),
    ],
)
def test_a_degenerate_measurement_is_one_line(sizes, times, ranks, says):
    with pytest.raises(DataError, match=says):
        fit(sizes, times, ranks)


def test_every_published_link_says_where_its_figures_come_from():
    assert set(PUBLISHED) == {"nvlink", "pcie5", "pcie4", "ib", "100gbe", "25gbe", "10gbe"}
    for link in PUBLISHED.values():
        assert link.busbw_gbps > 0 and link.alpha_s > 0 and not link.measured and len(link.source) > 30
    assert link_named("ib").busbw_gbps == 47.0  # NCCL's figure for an NDR NIC, as corpus.LINKS["ib-ndr"] takes it
    with pytest.raises(ConfigError, match="no link named 'infiniband': the links are nvlink, pcie5"):
        link_named("infiniband")


def test_plan_lists_the_published_links_with_their_sources(capsys):
    from ddplab.cli import main

    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    assert all(f"\n{name:<8} " in out for name in PUBLISHED if name != "nvlink") and out.startswith("link ")
    assert "(published, not measured)" in out.splitlines()[0]


@pytest.mark.slow(why="measures all-reduce with real Gloo processes")
def test_plan_measure_writes_the_measurement_and_its_fit(tmp_path, capsys):
    from ddplab.cli import main

    assert main(["plan", "--measure", "--nproc", "3,2", "--max-mib", "16", "--out", str(tmp_path / "links.json")]) == 0
    saved = json.loads((tmp_path / "links.json").read_text())
    assert saved["measurement"]["backend"] == "gloo" and saved["measurement"]["sizes"][-1] == 16 * 2**20
    assert saved["link"]["measured"] and saved["link"]["busbw_gbps"] > 0 and saved["machine"]["cpu_cores"] >= 1
    assert [saved["measurement"]["ranks"]] + [m["measurement"]["ranks"] for m in saved["more"]] == [2, 3]
    assert load_links(tmp_path / "links.json").ranks == [2, 3]
    out = capsys.readouterr().out
    assert (
        "fit (2 ranks): alpha" in out and "fit (3 ranks): alpha" in out and f"links: {tmp_path / 'links.json'}" in out
    )


def measurement(link: Link, ranks: int) -> dict:
    sizes = list(SIZES[:5])
    return {
        "backend": "gloo",
        "ranks": ranks,
        "device": "cpu",
        "sizes": sizes,
        "times_s": [link.allreduce_s(s, ranks) for s in sizes],
        "wall_s": 1.0,
    }


def test_a_links_file_holds_one_fit_per_number_of_ranks(tmp_path):
    """Saved and loaded back: each measurement fitted again (exactly, for times the model made); a prediction
    for N ranks takes the fit with N, else the nearest with more, else the one with the most."""
    two, four = Link("2", 1.0, 0.001, "test"), Link("4", 0.5, 0.005, "test")
    save_links(tmp_path / "links.json", [measurement(four, 4), measurement(two, 2)])
    loaded = load_links(tmp_path / "links.json")
    assert loaded.ranks == [2, 4]
    assert loaded.for_ranks(2).alpha_s == pytest.approx(0.001) and loaded.for_ranks(2).busbw_gbps == pytest.approx(1.0)
    assert loaded.for_ranks(3).alpha_s == pytest.approx(0.005) and loaded.for_ranks(8).ranks == 4
    assert loaded.for_ranks(1).ranks == 2 and two.for_ranks(8) is two  # a published link has one set of figures
    (tmp_path / "old.json").write_text(json.dumps({"measurement": measurement(two, 2)}))  # a file from before "more"
    assert load_links(tmp_path / "old.json").ranks == [2]
    (tmp_path / "bad.json").write_text(json.dumps({"measurement": measurement(two, 2), "more": "x"}))
    with pytest.raises(DataError, match=r"bad\.json: more is 'x', not a list, each item a JSON object$"):
        load_links(tmp_path / "bad.json")


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda m: m.update(ranks=0), r"measurement\.ranks is 0, not a whole number >= 2$"),
        (lambda m: m.pop("times_s"), r"lacks measurement\.times_s, which ddplab always writes"),
        (
            lambda m: m["times_s"].__setitem__(0, float("nan")),
            r"measurement\.times_s is \[nan, .*not a list, each item a number in \(0, ",
        ),
        (
            lambda m: m["times_s"].__setitem__(1, 1e308),
            r"measurement\.times_s is .*not a list, each item a number in \(0, 3600\]",
        ),
        (
            lambda m: m["sizes"].__setitem__(0, 10**400),
            r"measurement\.sizes is \[1000.*not a list, each item a number in \(0, ",
        ),
        (lambda m: m.update(backend=None), r"measurement\.backend is null, not text$"),
        (lambda m: m["sizes"].pop(), r"measurement times 5 sizes but lists 4$"),
        (
            lambda m: m.update(times_s=[0.001] * 5),
            r"measurement: the all-reduce times do not grow with the message size",
        ),
    ],
    ids=["zero-ranks", "no-times", "nan-time", "1e308-time", "400-digit-size", "null-backend", "sizes-short", "flat"],
)
def test_a_links_file_ddplab_did_not_write_is_one_line_naming_the_field(tmp_path, edit, says):
    """Every number of a links file reaches the fit checked: no ZeroDivisionError, OverflowError or nan."""
    record = measurement(Link("2", 1.0, 0.001, "test"), 2)
    edit(record)
    (tmp_path / "links.json").write_text(json.dumps({"measurement": record}))
    with pytest.raises(DataError, match=says):
        load_links(tmp_path / "links.json")
    skipped = []
    assert read_links(tmp_path / "links.json", skipped) is None and "links.json" in skipped[0]
