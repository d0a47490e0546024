"""Row masks under hostile filters: a clause repeated is evaluated once, and the masks kept are
keyed by a digest, not by the (possibly megabytes of) filter."""

from __future__ import annotations

from ragserve.filters import Filter, Match
from ragserve.index.metadata import FieldColumns
from ragserve.types import Chunk

SCHEMA = {"team": "keyword"}


def _columns() -> FieldColumns:
    chunks = [Chunk(f"d{i}#0", f"d{i}", "text", metadata={"team": ["a" if i % 2 else "b"]}) for i in range(10)]
    return FieldColumns(chunks, SCHEMA)


def test_a_clause_repeated_is_evaluated_once(monkeypatch) -> None:
    columns, calls = _columns(), []
    real = columns._clause

    def counting(clause: object):  # type: ignore[no-untyped-def]
        calls.append(clause)
        return real(clause)  # type: ignore[arg-type]

    monkeypatch.setattr(columns, "_clause", counting)
    clause = Match("team", ("a",))
    mask = columns.mask(Filter(must=(clause,) * 1000, should=(clause,) * 500, must_not=(Match("team", ("z",)),) * 300))
    assert len(calls) == 3
    assert list(mask) == [bool(i % 2) for i in range(10)]


def test_masks_kept_are_keyed_by_a_digest() -> None:
    columns = _columns()
    many = Filter(must=(Match("team", tuple(f"value-{i}" for i in range(20_000))),))
    columns.mask(many)
    (key,) = columns._kept
    assert len(key) == 16
    assert columns.mask(many) is columns.mask(many)  # found again by the same digest
