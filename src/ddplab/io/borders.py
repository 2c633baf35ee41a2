"""What ddplab accepts from a file it did not just write, or from another program: kinds of value, checked.

A run folder, a links file or a sweep manifest is read far from where it was written (another
machine, a later ddplab, a hand edit, a truncated copy), and Slurm's tools answer in text. What
such a border yields is checked here before any arithmetic sees it: a missing field, a wrong
type, zero where a count divides, NaN, 1e308 or a 400-digit integer is one DataError naming the
file (or program) and the field, never a traceback or a `nan` in a table. Each file kind has one
reader, which declares its fields with the kinds below (rundir/summary.read_summary, EpochRecord,
planner/links.measurements, sweepdir/folder.SweepFolder.load, ...); docs/contracts.md "Borders" says what each
command does with a bad one. Torch-free.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import MISSING, dataclass
from typing import Any, Callable

from ddplab.errors import DataError

LARGEST = 1e15  # no count, size, time or rate ddplab records comes near it; past it a number is an edit


@dataclass(frozen=True)
class Kind:
    """A kind of value a field holds: `accepts` it or not, and what it must be, in words."""

    what: str  # "a whole number >= 1", completing "... is X, not <what>"
    accepts: Callable[[Any], bool]
    nullable: bool = False  # None (JSON null) is a value of this kind: ddplab writes it for "not measured"

    def __or__(self, other: None) -> Kind:  # KIND | None: null allowed too
        assert other is None
        return Kind(f"{self.what} or null", self.accepts, nullable=True)

    def holds(self, value: Any) -> bool:
        return (value is None and self.nullable) or (value is not None and self.accepts(value))

    def check(self, value: Any, where: str, name: str) -> Any:
        if self.holds(value):
            return value
        raise DataError(f"{where}: {name} is {shown(value)}, not {self.what}")


def _real(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(value) <= LARGEST and (isinstance(value, int) or math.isfinite(value))  # ints first: no overflow


def number(
    least: float | None = None, most: float | None = None, *, above: float | None = None, below: float | None = None
) -> Kind:
    """A finite JSON number (an integer counts) within bounds: `least` and `most` included, `above` and `below` not."""
    low = f"[{least:g}" if least is not None else f"({above:g}" if above is not None else ""
    high = f"{most:g}]" if most is not None else f"{below:g})" if below is not None else ""
    if low and high:
        what = "a number from 0 to 1" if (low, high) == ("[0", "1]") else f"a number in {low}, {high}"
    elif low:
        what = f"a number {'>=' if low[0] == '[' else '>'} {low[1:]}"
    elif high:
        what = f"a number {'<=' if high[-1] == ']' else '<'} {high[:-1]}"
    else:
        what = "a number"
    return Kind(
        what,
        lambda v: (
            _real(v)
            and (least is None or v >= least)
            and (above is None or v > above)
            and (most is None or v <= most)
            and (below is None or v < below)
        ),
    )


def whole(least: int = 0) -> Kind:
    return Kind(
        f"a whole number >= {least}", lambda v: isinstance(v, int) and not isinstance(v, bool) and least <= v <= LARGEST
    )


def list_of(kind: Kind) -> Kind:
    """A JSON list whose items are each of `kind`."""
    return Kind(
        f"a list, each item {kind.what}",
        lambda v: (
            isinstance(v, list) and all((x is None and kind.nullable) or (x is not None and kind.accepts(x)) for x in v)
        ),
    )


TEXT = Kind("text", lambda v: isinstance(v, str))
INTEGER = Kind("a whole number", lambda v: isinstance(v, int) and not isinstance(v, bool) and abs(v) <= LARGEST)
SCALAR = Kind("text, a number, true or false", lambda v: isinstance(v, (str, bool)) or _real(v))
FLAG = Kind("true or false", lambda v: isinstance(v, bool))
TABLE = Kind("a JSON object", lambda v: isinstance(v, dict))
LIST = Kind("a JSON list", lambda v: isinstance(v, list))
ANY = Kind("anything", lambda v: True, nullable=True)
SECONDS = number(0)
SHARE = number(0, 1)
COUNT = whole(1)
WHOLE = whole(0)


def one_of(*choices: str) -> Kind:
    return Kind("one of " + ", ".join(choices), lambda v: v in choices)


def check(data: Any, schema: dict[str, Any], where: str, *, required: tuple[str, ...] = (), prefix: str = "") -> Any:
    """`data` checked against `schema` (field -> Kind, or a nested schema for a JSON object); fields not in
    the schema pass as they are (a newer writer's additions). A field in `required` (dotted) must be there;
    others may be absent (an older writer's file). Returns `data`."""
    if not isinstance(data, dict):
        raise DataError(f"{where}{': ' + prefix.rstrip('.') if prefix else ''} is {shown(data)}, not a JSON object")
    for name in required:
        if name.partition(".")[0] not in data:
            raise DataError(
                f"{where} lacks {prefix}{name}, which ddplab always writes: written by another program, or edited?"
            )
    for name, kind in schema.items():
        if name not in data:
            continue
        if isinstance(kind, dict):
            inner = tuple(r.partition(".")[2] for r in required if r.startswith(name + "."))
            if data[name] is not None or inner or name in required:  # null: a section not written (an older ddplab)
                check(data[name], kind, where, prefix=f"{prefix}{name}.", required=inner)
        else:
            kind.check(data[name], where, prefix + name)
    return data


def check_each(data: Any, kind: Kind | dict[str, Any], where: str, name: str) -> Any:
    """A JSON object whose every value is of `kind` (its keys are names: ranks' figures, a sweep point's axes), or a
    JSON list whose every item is (a plan's rows)."""
    if isinstance(data, list):
        items = [(f"{name}[{i}]", value) for i, value in enumerate(data)]
    else:
        TABLE.check(data, where, name)
        items = [(f"{name}.{key}", value) for key, value in data.items()]
    for at, value in items:
        if isinstance(kind, dict):
            check(value, kind, where, prefix=f"{at}.")
        else:
            kind.check(value, where, at)
    return data


@dataclass(frozen=True)
class Each:
    """In a declaration: a JSON object of names, or a JSON list, whose every value is `kind` (a Kind, or a TypedDict
    declaring one)."""

    kind: Any


@dataclass(frozen=True)
class Declared:
    """What a file's TypedDict declares, for its reader: each field's kind (a nested schema for a part), the dotted
    fields every writer wrote, and the objects of names checked value by value (`check_each`)."""

    schema: dict[str, Any]
    required: tuple[str, ...]
    each: dict[str, Kind | dict[str, Any]]

    def check(self, data: Any, where: str, prefix: str = "") -> Any:
        check(data, self.schema, where, required=self.required, prefix=prefix)
        for name, kind in self.each.items():
            if isinstance(data, dict) and data.get(name) is not None:
                check_each(data[name], kind, where, prefix + name)
        return data


def declared(typed: type, *, unwritten: tuple[str, ...] = ()) -> Declared:
    """A file format declared once, as the TypedDict its readers are typed with (or the dataclass it is read into):
    each field `Annotated[type, KIND]` (`Each(...)` after it for an object of names), a part its own TypedDict;
    required are a TypedDict's required keys, a dataclass's fields without a default (`unwritten`: a dataclass's
    fields the file does not hold). The reader's schema, its required fields and the static type cannot disagree."""
    hints = {k: v for k, v in typing.get_type_hints(typed, include_extras=True).items() if k not in unwritten}
    if dataclasses.is_dataclass(typed):
        defaulted = {
            f.name for f in dataclasses.fields(typed) if f.default is not MISSING or f.default_factory is not MISSING
        }
        must = set(hints) - defaulted
    else:
        must = set(typed.__required_keys__)  # type: ignore[attr-defined]
    schema: dict[str, Any] = {}
    required: list[str] = []
    each: dict[str, Kind | dict[str, Any]] = {}
    for name, hint in hints.items():
        if typing.is_typeddict(hint):
            part = declared(hint)
            schema[name] = part.schema
            required += ([f"{name}.{r}" for r in part.required] or [name]) if name in must else []
            continue
        extras = getattr(hint, "__metadata__", ())
        kinds = [x for x in extras if isinstance(x, Kind)]
        if len(kinds) != 1:
            raise TypeError(f"{typed.__name__}.{name}: declare its kind, Annotated[type, KIND]")
        schema[name] = kinds[0]
        required += [name] if name in must else []
        for x in extras:
            if isinstance(x, Each):
                each[name] = declared(x.kind).schema if typing.is_typeddict(x.kind) else x.kind
    return Declared(schema, tuple(required), each)


def kept(data: Any, schema: dict[str, Kind], where: str) -> tuple[dict[str, Any], list[str]]:
    """For a file read leniently (it only adds to what is shown): `data` less the fields that are not of their
    kind, and a line for each left out."""
    if not isinstance(data, dict):
        return {}, [f"{where} is {shown(data)}, not a JSON object: left out"]
    out, skipped = dict(data), []
    for name, kind in schema.items():
        if name in out:
            try:
                kind.check(out[name], where, name)
            except DataError as exc:
                del out[name]
                skipped.append(f"{exc}: left out")
    return out, skipped


def shown(value: Any, width: int = 40) -> str:
    """A value as an error line quotes it: short, whatever it is (a 400-digit integer, a long text)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**20:
        digits = str(abs(value))
        return f"{'-' * (value < 0)}{digits[:12]}... ({len(digits)} digits)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."
