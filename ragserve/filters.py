"""Metadata filters: the language (Qdrant's shape), its check against a version's fields, and its meaning.

A filter is must / should / must_not over conditions on metadata fields: a value equals one
(`match.value`), one of several (`match.any`), a range (`range`: gt/gte/lt/lte), or the field is set
(`exists`); a condition may be a nested filter. A multi-valued field (a list) matches when any of
its values does, as in Qdrant. Every backend narrows its search with the same checked `Filter`;
`matches` is the meaning they all must agree with (the property tests hold them to it).

Fields and their types come from the index version's manifest (`FieldSchema`): a filter naming an
unknown field, or a value of the wrong type, is refused naming the field (`InvalidArgument`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, Literal, Union, get_args

from ragserve.errors import InvalidArgument

FieldType = Literal["keyword", "integer", "float", "bool", "datetime"]
FIELD_TYPES: tuple[str, ...] = get_args(FieldType)
Scalar = Union[str, int, float, bool]  # noqa: UP007 (a runtime alias)

# The request field every filter error names, followed by the path inside it.
_FIELD = "filter"
# Longest keyword value a filter or a document may hold (a key in a posting table).
MAX_KEYWORD_CHARS = 512


@dataclass(frozen=True, slots=True)
class FilterLimits:
    """Bounds on one request's filter (settings: RAGSERVE_FILTER_*)."""

    max_conditions: int = 64
    max_depth: int = 4
    max_values: int = 256


@dataclass(frozen=True, slots=True)
class Match:
    """The field holds `values[0]` (any=False) or one of `values` (any=True)."""

    key: str
    values: tuple[Scalar, ...]
    any: bool = False


@dataclass(frozen=True, slots=True)
class Range:
    """The field holds a number (or a datetime, as POSIX seconds) within the bounds that are set."""

    key: str
    gt: float | None = None
    gte: float | None = None
    lt: float | None = None
    lte: float | None = None


@dataclass(frozen=True, slots=True)
class Exists:
    """The field is set (present: True) or not set (False) on the document."""

    key: str
    present: bool = True


@dataclass(frozen=True, slots=True)
class Filter:
    """All of `must`, at least one of `should` (when any), none of `must_not`."""

    must: tuple[Clause, ...] = ()
    should: tuple[Clause, ...] = ()
    must_not: tuple[Clause, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.must or self.should or self.must_not)


Clause = Union[Match, Range, Exists, Filter]  # noqa: UP007 (a runtime alias)


def both(first: Filter | None, second: Filter | None) -> Filter | None:
    """Documents that pass both (None: no narrowing)."""
    if first is None or first.empty:
        return second
    if second is None or second.empty:
        return first
    return Filter(must=(first, second))


# ---- the field schema ----------------------------------------------------------------------------


class FieldSchema(Mapping[str, str]):
    """A version's filterable fields and their types (an immutable, hashable mapping)."""

    def __init__(self, fields: Mapping[str, str] | None = None) -> None:
        items = dict(fields or {})
        for name, kind in items.items():
            if kind not in FIELD_TYPES:
                raise ValueError(f"field {name!r} has type {kind!r}; types are {', '.join(FIELD_TYPES)}")
        self._fields = dict(sorted(items.items()))

    def __getitem__(self, key: str) -> str:
        return self._fields[key]

    def __iter__(self) -> Any:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __hash__(self) -> int:
        return hash(tuple(self._fields.items()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self._fields) == dict(other)

    def __repr__(self) -> str:
        return f"FieldSchema({self._fields!r})"


def parse_datetime(value: Any) -> float:
    """POSIX seconds of an RFC 3339 / ISO 8601 date or time (a time without a zone is UTC)."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):
        moment = datetime(value.year, value.month, value.day, tzinfo=UTC)
    elif isinstance(value, str):
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    else:
        raise ValueError(f"{value!r} is not a date or time")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def format_datetime(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).isoformat()


def coerce_value(kind: str, value: Any) -> Scalar:
    """`value` as a field of type `kind` holds it (ValueError if it cannot): a datetime as an ISO
    string in UTC, an integral float as an int for an integer field."""
    if kind == "keyword":
        if not isinstance(value, str) or not value or len(value) > MAX_KEYWORD_CHARS or "\x00" in value:
            raise ValueError(f"{value!r} is not a keyword (a non-empty string of at most {MAX_KEYWORD_CHARS})")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"{value!r} is not true or false")
        return value
    if kind == "datetime":
        return format_datetime(parse_datetime(value))
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{value!r} is not a finite number")
    if kind == "integer":
        if float(value) != int(value) or abs(value) > 2**53:
            raise ValueError(f"{value!r} is not an integer")
        return int(value)
    return float(value)


def sortable(kind: str, value: Scalar) -> float:
    """A numeric or datetime value as the float ranges compare."""
    return parse_datetime(value) if kind == "datetime" else float(value)


# ---- parsing and checking --------------------------------------------------------------------------


@dataclass
class _Budget:
    limits: FilterLimits
    conditions: int = 0


def parse_filter(raw: Any, schema: Mapping[str, str], limits: FilterLimits | None = None) -> Filter | None:
    """A filter from its JSON form (Qdrant's shape; the proto's JSON mapping is the same), checked
    against `schema`. None or {} means no filter. InvalidArgument names the field path at fault."""
    if raw is None or raw == {}:
        return None
    checked = _filter(raw, _FIELD, schema, _Budget(limits or FilterLimits()), 1)
    return None if checked.empty else checked


def _filter(raw: Any, path: str, schema: Mapping[str, str], budget: _Budget, depth: int) -> Filter:
    if depth > budget.limits.max_depth:
        raise InvalidArgument(path, f"nests deeper than {budget.limits.max_depth} filters (RAGSERVE_FILTER_MAX_DEPTH)")
    if not isinstance(raw, Mapping):
        raise InvalidArgument(path, "must be an object with must, should and must_not")
    unknown = sorted(set(raw) - {"must", "should", "must_not"})
    if unknown:
        raise InvalidArgument(f"{path}.{unknown[0]}", "is not part of a filter (must, should, must_not)")
    parts: dict[str, tuple[Clause, ...]] = {}
    for name in ("must", "should", "must_not"):
        items = raw.get(name) or []
        if not isinstance(items, Sequence) or isinstance(items, str):
            raise InvalidArgument(f"{path}.{name}", "must be a list of conditions")
        parts[name] = tuple(
            _condition(item, f"{path}.{name}[{i}]", schema, budget, depth) for i, item in enumerate(items)
        )
    return Filter(parts["must"], parts["should"], parts["must_not"])


def _condition(raw: Any, path: str, schema: Mapping[str, str], budget: _Budget, depth: int) -> Clause:
    budget.conditions += 1
    if budget.conditions > budget.limits.max_conditions:
        raise InvalidArgument(
            path, f"more than {budget.limits.max_conditions} conditions (RAGSERVE_FILTER_MAX_CONDITIONS)"
        )
    if not isinstance(raw, Mapping):
        raise InvalidArgument(path, "must be an object")
    tests = [name for name in ("match", "range", "exists", "filter") if name in raw]
    if len(tests) != 1 or set(raw) - {"key", *tests}:
        raise InvalidArgument(path, "needs exactly one of match, range, exists or filter (and key for the first three)")
    test = tests[0]
    if test == "filter":
        if raw.get("key"):
            raise InvalidArgument(f"{path}.key", "a nested filter takes no key")
        return _filter(raw["filter"], f"{path}.filter", schema, budget, depth + 1)
    key = raw.get("key")
    if not isinstance(key, str) or not key:
        raise InvalidArgument(f"{path}.key", "must name a field")
    if key not in schema:
        known = ", ".join(schema) or "none: this index version declares no filterable fields"
        raise InvalidArgument(f"{path}.key", f"{key[:64]!r} is not a filterable field of this index (fields: {known})")
    kind = schema[key]
    where = f"{path}.{test}"
    if test == "exists":
        if not isinstance(raw["exists"], bool):
            raise InvalidArgument(where, "must be true or false")
        return Exists(key, raw["exists"])
    if test == "range":
        return _range(raw["range"], where, key, kind)
    return _match(raw["match"], where, key, kind, budget.limits)


def _value(kind: str, value: Any, where: str, key: str) -> Scalar:
    try:
        return coerce_value(kind, value)
    except (ValueError, OverflowError) as exc:
        raise InvalidArgument(where, f"field {key!r} is {kind}: {exc}") from None


def _match(raw: Any, where: str, key: str, kind: str, limits: FilterLimits) -> Match:
    if not isinstance(raw, Mapping) or len(raw) != 1 or next(iter(raw)) not in ("value", "any"):
        raise InvalidArgument(where, "must be {value: V} or {any: [V, ...]}")
    if "value" in raw:
        return Match(key, (_value(kind, raw["value"], f"{where}.value", key),))
    values = raw["any"]
    if not isinstance(values, Sequence) or isinstance(values, str) or not values:
        raise InvalidArgument(f"{where}.any", "must be a non-empty list of values")
    if len(values) > limits.max_values:
        raise InvalidArgument(f"{where}.any", f"more than {limits.max_values} values (RAGSERVE_FILTER_MAX_VALUES)")
    checked = {_value(kind, v, f"{where}.any[{i}]", key) for i, v in enumerate(values)}
    return Match(key, tuple(sorted(checked, key=repr)), any=True)


def _range(raw: Any, where: str, key: str, kind: str) -> Range:
    if kind not in ("integer", "float", "datetime"):
        raise InvalidArgument(where, f"field {key!r} is {kind}: ranges apply to integer, float and datetime fields")
    if not isinstance(raw, Mapping) or not raw or set(raw) - {"gt", "gte", "lt", "lte"}:
        raise InvalidArgument(where, "must set one or more of gt, gte, lt, lte")
    bounds = {name: sortable(kind, _value(kind, value, f"{where}.{name}", key)) for name, value in raw.items()}
    return Range(key, bounds.get("gt"), bounds.get("gte"), bounds.get("lt"), bounds.get("lte"))


# ---- meaning ---------------------------------------------------------------------------------------


def values_of(metadata: Mapping[str, Any], key: str) -> list[Any]:
    value = metadata.get(key)
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def matches(flt: Filter | None, metadata: Mapping[str, Any], schema: Mapping[str, str]) -> bool:
    """Whether a document with `metadata` (values as `coerce_value` stores them) passes `flt`."""
    if flt is None:
        return True
    return (
        all(_holds(c, metadata, schema) for c in flt.must)
        and (not flt.should or any(_holds(c, metadata, schema) for c in flt.should))
        and not any(_holds(c, metadata, schema) for c in flt.must_not)
    )


def _holds(clause: Clause, metadata: Mapping[str, Any], schema: Mapping[str, str]) -> bool:
    if isinstance(clause, Filter):
        return matches(clause, metadata, schema)
    values = values_of(metadata, clause.key)
    if isinstance(clause, Exists):
        return bool(values) == clause.present
    if isinstance(clause, Match):
        # bool is an int to ==: compare type and value, so true never matches 1.
        wanted = {(type(v), v) for v in clause.values}
        return any((type(v), v) in wanted for v in values)
    kind = schema.get(clause.key, "float")
    return any(in_range(clause, sortable(kind, v)) for v in values)


def in_range(bounds: Range, x: float) -> bool:
    return (
        (bounds.gt is None or x > bounds.gt)
        and (bounds.gte is None or x >= bounds.gte)
        and (bounds.lt is None or x < bounds.lt)
        and (bounds.lte is None or x <= bounds.lte)
    )


def canonical(flt: Filter | None) -> Any:
    """A JSON-able form of a checked filter, equal for equal filters (cache keys)."""
    if flt is None:
        return None

    def clause(c: Clause) -> Any:
        if isinstance(c, Filter):
            return ["filter", canonical(c)]
        if isinstance(c, Match):
            return ["match", c.key, c.any, [[type(v).__name__, v] for v in c.values]]
        if isinstance(c, Range):
            return ["range", c.key, c.gt, c.gte, c.lt, c.lte]
        return ["exists", c.key, c.present]

    return [[clause(c) for c in part] for part in (flt.must, flt.should, flt.must_not)]


def check_fields(flt: Filter | None, schema: Mapping[str, str]) -> None:
    """A filter checked against one version, served by another (a reload in between), must still
    name only fields that version has."""
    missing = sorted(keys_of(flt) - set(schema))
    if missing:
        raise InvalidArgument(_FIELD, f"{missing[0]!r} is not a filterable field of the index version now served")


def keys_of(flt: Filter | None) -> set[str]:
    """Every field a filter names."""
    if flt is None:
        return set()
    out: set[str] = set()
    for c in (*flt.must, *flt.should, *flt.must_not):
        out |= keys_of(c) if isinstance(c, Filter) else {c.key}
    return out
