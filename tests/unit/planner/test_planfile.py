"""plan.json's declaration: the file `ddplab plan` writes is the one its reader accepts, field for field, and a bad
one is refused naming the file and the field."""

import dataclasses
import json
import typing

import pytest

from ddplab.errors import DataError
from ddplab.planner import band, model
from ddplab.planner.planfile import BandPart, PlanFile, PlanRow, read_plan

from support.runs import write_run


def test_the_records_written_are_the_ones_declared():
    """A row is a Prediction with four more fields, a band a Band and its marks: each name a writer gives is one
    declared."""
    prediction = [f.name for f in dataclasses.fields(model.Prediction)]
    assert list(typing.get_type_hints(PlanRow))[: len(prediction)] == prediction
    assert list(typing.get_type_hints(PlanRow))[len(prediction) :] == [
        "workers",
        "above_ideal",
        "images_per_s_band",
        "band",
    ]
    assert list(typing.get_type_hints(BandPart)) == [*(f.name for f in dataclasses.fields(band.Band)), "marks"]


@pytest.fixture
def plan(tmp_path):
    from ddplab.cli import main

    run = write_run(tmp_path / "r", strategy="ddp", nproc=4, batch=50, device="cuda")
    argv = ["plan", str(run), "--gpus", "1,2,4", "--nodes", "1,2", "--inter-link", "ib", "--batch", "16,50"]
    assert main([*argv, "--out", str(tmp_path / "plan.json")]) == 0
    return tmp_path / "plan.json"


def test_a_plan_is_read_back_as_written_with_every_band_its_rows_need(plan):
    saved = read_plan(plan)
    assert saved == json.loads(plan.read_text())
    assert set(PlanFile.__optional_keys__) == {"images_per_s_if_the_wire_overlaps"}  # a CPU plan's, across nodes
    assert len(saved["rows"]) == 12 and all(set(r) == set(PlanRow.__required_keys__) for r in saved["rows"])
    named = {r["band"] for r in saved["rows"]} - {None}
    assert named == set(saved["bands"]) and len(named) >= 5  # one node at 2 and 4, across, from the node, batches


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda p: p["rows"][3].update(speedup="fast"), r"rows\[3\]\.speedup is 'fast', not a number >= 0"),
        (lambda p: p["rows"][0].update(per_node=0), r"rows\[0\]\.per_node is 0, not a whole number >= 1"),
        (lambda p: p.pop("bands"), r"lacks bands, which ddplab always writes"),
        (lambda p: p["bands"]["a"].update(hi=None), r"bands\.a\.hi is null, not a number >= 0"),
        (
            lambda p: p["bands"]["b"].update(marks=["narrow"]),
            r"bands\.b\.marks is \['narrow'\], not a list, each item one of few, wide",
        ),
        (lambda p: p["measured"].update(step_s=float("nan")), r"measured\.step_s is nan, not a number >= 0"),
        (lambda p: p.update(rows={}), r"rows is \{\}, not a JSON list"),
    ],
)
def test_a_bad_plan_is_refused_naming_the_file_and_the_field(plan, edit, said):
    data = json.loads(plan.read_text())
    edit(data)
    plan.write_text(json.dumps(data))
    with pytest.raises(DataError, match=f"^{plan}:? {said}"):
        read_plan(plan)
