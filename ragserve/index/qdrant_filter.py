"""A checked filter (ragserve/filters.py) as a Qdrant filter, and the payload indexes that serve it.

Metadata lives under the point payload's `metadata` object, so field `lang` is Qdrant's key
`metadata.lang`. Qdrant matches only strings, integers and booleans by value: a float or datetime
`match` becomes a closed range on the value itself, which means the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ragserve.filters import Clause, Exists, Filter, Match, parse_datetime

PAYLOAD_KEY = "metadata"

_SCHEMA_TYPES = {"keyword": "KEYWORD", "integer": "INTEGER", "float": "FLOAT", "bool": "BOOL", "datetime": "DATETIME"}


def payload_key(field: str) -> str:
    return f"{PAYLOAD_KEY}.{field}"


def create_payload_indexes(client: Any, collection: str, fields: Mapping[str, str]) -> None:
    """One payload index per filterable field, so a filter is an index lookup, not a scan."""
    from qdrant_client import models

    for name, kind in fields.items():
        schema = getattr(models.PayloadSchemaType, _SCHEMA_TYPES[kind])
        client.create_payload_index(collection, payload_key(name), field_schema=schema, wait=True)


def qdrant_filter(flt: Filter | None, fields: Mapping[str, str]) -> Any:
    """models.Filter for `flt` (None for no filter)."""
    if flt is None:
        return None
    from qdrant_client import models

    def convert(f: Filter) -> Any:
        return models.Filter(
            must=[_condition(c, fields, convert) for c in f.must] or None,
            should=[_condition(c, fields, convert) for c in f.should] or None,
            must_not=[_condition(c, fields, convert) for c in f.must_not] or None,
        )

    return convert(flt)


def _moment(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, tz=UTC)


def _condition(clause: Clause, fields: Mapping[str, str], convert: Any) -> Any:
    from qdrant_client import models

    if isinstance(clause, Filter):
        return convert(clause)
    # A field the version does not declare (an access grant's) is one no point holds: Qdrant
    # matches nothing on it, as the local index does; its type then does not matter.
    key, kind = payload_key(clause.key), fields.get(clause.key, "keyword")
    if isinstance(clause, Exists):
        empty = models.IsEmptyCondition(is_empty=models.PayloadField(key=key))
        return models.Filter(must_not=[empty]) if clause.present else empty
    if isinstance(clause, Match):
        if kind in ("keyword", "integer", "bool"):
            if clause.any and kind != "bool":
                return models.FieldCondition(key=key, match=models.MatchAny(any=list(clause.values)))
            options = [models.FieldCondition(key=key, match=models.MatchValue(value=v)) for v in clause.values]
            return options[0] if len(options) == 1 else models.Filter(should=options)
        points = [parse_datetime(v) if kind == "datetime" else float(v) for v in clause.values]
        ranges = [_range(key, kind, None, x, None, x) for x in points]
        return ranges[0] if len(ranges) == 1 else models.Filter(should=ranges)
    return _range(key, kind, clause.gt, clause.gte, clause.lt, clause.lte)


def _range(key: str, kind: str, gt: float | None, gte: float | None, lt: float | None, lte: float | None) -> Any:
    from qdrant_client import models

    if kind == "datetime":
        bounds = models.DatetimeRange(gt=_moment(gt), gte=_moment(gte), lt=_moment(lt), lte=_moment(lte))
        return models.FieldCondition(key=key, range=bounds)
    return models.FieldCondition(key=key, range=models.Range(gt=gt, gte=gte, lt=lt, lte=lte))
