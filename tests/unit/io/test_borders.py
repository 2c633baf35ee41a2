"""The kinds a field read from a file may hold (borders.py): what passes, and the one line for what does not."""

import math

import pytest

from ddplab.errors import DataError
from ddplab.io.borders import COUNT, SHARE, TEXT, check, kept, list_of, number, shown


@pytest.mark.parametrize(
    "kind, good, bad",
    [
        (COUNT, [1, 7, 10**15], [0, -1, 1.0, True, "1", None, 10**16, 10**400]),
        (SHARE, [0, 0.5, 1], [-0.1, 1.01, math.nan, math.inf, "0.5", False]),
        (number(above=0, most=10), [1e-9, 10], [0, 10.5, -math.inf]),
        (number(), [-1e15, 0, 1e15], [1e308, -1e308, math.nan]),
        (list_of(number(0) | None), [[], [1, None, 2.5]], [[1, "x"], [-1], "[]", None, [math.nan]]),
        (TEXT | None, ["", "x", None], [0, [], {}]),
    ],
)
def test_each_kind_takes_what_ddplab_writes_and_nothing_else(kind, good, bad):
    for value in good:
        assert kind.check(value, "f.json", "field") is value
    for value in bad:
        with pytest.raises(DataError, match=r"^f\.json: field is .*, not "):
            kind.check(value, "f.json", "field")


def test_a_value_is_quoted_short_whatever_it_is():
    assert shown(int("9" * 400)) == "999999999999... (400 digits)"
    assert shown(-(10**30)) == "-100000000000... (31 digits)"
    assert shown("x" * 100) == repr("x" * 100)[:37] + "..." and len(shown("x" * 100, 80)) == 80
    assert (shown(None), shown(True), shown(math.nan), shown(1e308)) == ("null", "true", "nan", "1e+308")


def test_nested_fields_are_named_by_their_path_and_required_ones_must_be_there():
    schema = {"run": {"world_size": COUNT, "device": TEXT}, "note": TEXT | None}
    assert check({"run": {"world_size": 2}, "extra": object()}, schema, "s.json") is not None  # newer fields pass
    with pytest.raises(DataError, match=r"^s\.json: run\.world_size is 0, not a whole number >= 1$"):
        check({"run": {"world_size": 0}}, schema, "s.json")
    with pytest.raises(DataError, match=r"^s\.json lacks run\.device, which ddplab always writes"):
        check({"run": {"world_size": 2}}, schema, "s.json", required=("run.device",))
    with pytest.raises(DataError, match=r"^s\.json lacks run\.device"):
        check({}, schema, "s.json", required=("run.device",))
    with pytest.raises(DataError, match=r"^s\.json: run is null, not a JSON object$"):
        check({"run": None}, schema, "s.json", required=("run.device",))
    assert check({"run": None}, schema, "s.json") == {"run": None}  # a section an older writer left out
    with pytest.raises(DataError, match=r"^s\.json is \[\], not a JSON object$"):
        check([], schema, "s.json")


def test_a_file_read_leniently_keeps_what_is_good_and_says_what_it_left_out():
    data, skipped = kept({"cpus": "two", "torch": "2.13", "other": 1}, {"cpus": COUNT, "torch": TEXT}, "env.json")
    assert data == {"torch": "2.13", "other": 1}
    assert skipped == ["env.json: cpus is 'two', not a whole number >= 1: left out"]
    assert kept([1], {"cpus": COUNT}, "env.json") == ({}, ["env.json is [1], not a JSON object: left out"])


def test_a_format_declared_once_gives_its_reader_the_kinds_the_required_fields_and_the_objects_of_names():
    from typing import Annotated, TypedDict

    from ddplab.io.borders import COUNT, TABLE, TEXT, Each, declared, number

    class Part(TypedDict, total=False):
        rate: Annotated[float, number(0)]

    class _Written(TypedDict):
        name: Annotated[str, TEXT]
        part: Part  # no field of it required: the part itself is

    class Format(_Written, total=False):
        count: Annotated[int, COUNT]
        ranks: Annotated[dict[str, float], TABLE, Each(number(0))]

    found = declared(Format)
    assert found.required == ("name", "part") and set(found.schema) == {"name", "part", "count", "ranks"}
    assert found.schema["part"]["rate"].what == "a number >= 0" and found.each["ranks"].what == "a number >= 0"
    with pytest.raises(DataError, match=r"f.json: part.rate is -1, not a number >= 0"):
        found.check({"name": "x", "part": {"rate": -1}}, "f.json")
    with pytest.raises(DataError, match=r"f.json: ranks.r1 is 'a', not a number >= 0"):
        found.check({"name": "x", "part": {}, "ranks": {"r1": "a"}}, "f.json")

    class Undeclared(TypedDict):
        name: str

    with pytest.raises(TypeError, match=r"Undeclared.name: declare its kind"):
        declared(Undeclared)
