"""A loaded version's metadata as columns, so a filter becomes a row mask in numpy, not a loop over chunks.

Per field: a posting list per value (match) and the (row, value) pairs of its numbers and
datetimes (range). Masks of recent filters are kept (an access grant repeats on every call).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson

from ragserve.filters import Clause, Exists, Filter, Match, canonical, sortable, values_of
from ragserve.types import Chunk

# Masks kept for repeated filters; each is one byte per chunk.
_MASKS_KEPT = 32


class _Column:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.postings: dict[tuple[type, Any], list[int]] = {}
        self.rows: list[int] = []  # one entry per (row, value) pair, for ranges
        self.numbers: list[float] = []
        self.present: list[int] = []


class FieldColumns:
    """Row masks for checked filters over one version's chunks (row i = chunk i). Thread-safe."""

    def __init__(self, chunks: Sequence[Chunk], schema: Mapping[str, str]) -> None:
        self.count = len(chunks)
        self.schema = dict(schema)
        columns = {name: _Column(kind) for name, kind in schema.items()}
        # No fields, no pass over the chunks (a mapped docstore would decode every one).
        for row, chunk in enumerate(chunks if columns else ()):
            for name, column in columns.items():
                values = values_of(chunk.metadata, name)
                if values:
                    column.present.append(row)
                for value in values:
                    column.postings.setdefault((type(value), value), []).append(row)
                    if column.kind in ("integer", "float", "datetime"):
                        column.rows.append(row)
                        column.numbers.append(sortable(column.kind, value))
        self._postings = {
            name: {value: np.unique(np.asarray(rows, dtype=np.int64)) for value, rows in c.postings.items()}
            for name, c in columns.items()
        }
        self._ranges = {
            name: (np.asarray(c.rows, dtype=np.int64), np.asarray(c.numbers, dtype=np.float64))
            for name, c in columns.items()
        }
        self._present = {name: np.asarray(c.present, dtype=np.int64) for name, c in columns.items()}
        self._kept: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def mask(self, flt: Filter) -> np.ndarray:
        """A read-only boolean array: True where the chunk passes `flt`."""
        key = orjson.dumps(canonical(flt))
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
                return kept
        mask = self._filter(flt)
        mask.flags.writeable = False
        with self._lock:
            self._kept[key] = mask
            while len(self._kept) > _MASKS_KEPT:
                self._kept.popitem(last=False)
        return mask

    def _filter(self, flt: Filter) -> np.ndarray:
        out = np.ones(self.count, dtype=bool)
        for clause in flt.must:
            out &= self._clause(clause)
        if flt.should:
            any_of = np.zeros(self.count, dtype=bool)
            for clause in flt.should:
                any_of |= self._clause(clause)
            out &= any_of
        for clause in flt.must_not:
            out &= ~self._clause(clause)
        return out

    def _clause(self, clause: Clause) -> np.ndarray:
        if isinstance(clause, Filter):
            return self._filter(clause)
        out = np.zeros(self.count, dtype=bool)
        if clause.key not in self.schema:  # a field this version lacks (an access grant's): no chunk has it
            return ~out if isinstance(clause, Exists) and not clause.present else out
        if isinstance(clause, Exists):
            out[self._present[clause.key]] = True
            return out if clause.present else ~out
        if isinstance(clause, Match):
            postings = self._postings[clause.key]
            for value in clause.values:
                rows = postings.get((type(value), value))
                if rows is not None:
                    out[rows] = True
            return out
        rows, numbers = self._ranges[clause.key]
        inside = np.ones(numbers.shape, dtype=bool)
        for bound, compare in (
            (clause.gt, np.greater),
            (clause.gte, np.greater_equal),
            (clause.lt, np.less),
            (clause.lte, np.less_equal),
        ):
            if bound is not None:
                inside &= compare(numbers, bound)
        out[rows[inside]] = True
        return out
