"""Entry <-> bytes with orjson, the same for every store (so one contract suite covers both)."""

from __future__ import annotations

import math
from typing import Any, TypeVar

import orjson

from ragserve.cache.base import CachedAnswer, CachedRetrieval, RejectedEntry
from ragserve.cache.keys import KEY_SCHEMA
from ragserve.events import Usage
from ragserve.index.chunk_store import location_of
from ragserve.json_bytes import kept_json
from ragserve.types import Chunk, Passage

T = TypeVar("T")

# Marks an answer entry: a passage list can never be decoded as an answer, nor the reverse.
_ANSWER_KIND = "answer"


def _passage_rows(passages: tuple[Passage, ...]) -> list[list[Any]]:
    return [
        [
            p.chunk.chunk_id,
            p.chunk.doc_id,
            p.chunk.text,
            p.chunk.title,
            p.chunk.source,
            p.chunk.start,
            p.chunk.end,
            p.score,
            p.rank,
            p.chunk.metadata,
            p.dense,
            p.lexical,
            None if p.chunk.location is None else p.chunk.location.record(),
        ]
        for p in passages
    ]


# More tiers than any configuration makes (two today): a longer list is not one of ours.
_MAX_RERANK_TIERS = 8


def _typed(value: Any, kind: type[T], what: str) -> T:
    # bool is an int to isinstance: a count must be a real int.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{what} is {type(value).__name__}, not {kind.__name__}")
    return value


def _ints(value: Any, n: int, what: str) -> list[int]:
    if not isinstance(value, list) or len(value) != n:
        raise ValueError(f"{what} is not a list of {n}")
    counts = [_typed(v, int, what) for v in value]
    if any(c < 0 for c in counts):
        raise RejectedEntry("out_of_bounds", f"negative {what}")
    return counts


def _passages(rows: Any, top_k: int) -> tuple[Passage, ...]:
    """Every field typed; at most `top_k` passages (when known), ranked 1..n, offsets in order."""
    rows = _typed(rows, list, "passages")
    if top_k and len(rows) > top_k:
        raise RejectedEntry("out_of_bounds", f"{len(rows)} passages for top_k {top_k}")
    passages = []
    for rank, row in enumerate(rows, start=1):
        _typed(row, list, "passage")
        # 10: written before the raw scores were kept; 12: before the chunk's location
        if len(row) not in (10, 12, 13):
            raise ValueError("malformed passage")
        cid, doc, text, title, source = (_typed(f, str, "passage field") for f in row[:5])
        start, end = _typed(row[5], int, "chunk start"), _typed(row[6], int, "chunk end")
        score = row[7]
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            raise ValueError("passage score is not a finite number")
        if _typed(row[8], int, "passage rank") != rank:
            raise RejectedEntry("out_of_bounds", "passage ranks are not 1..n")
        if not 0 <= start <= end:
            raise RejectedEntry("out_of_bounds", "chunk offsets out of order")
        location = location_of(row[12]) if len(row) == 13 else None
        chunk = Chunk(cid, doc, text, title, source, start, end, _metadata(row[9]), location=location)
        dense, lexical = (_raw_score(v) for v in row[10:12]) if len(row) >= 12 else (None, None)
        passages.append(Passage(chunk, float(score), rank, dense=dense, lexical=lexical))
    return tuple(passages)


def _raw_score(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError("passage raw score is not a finite number")
    return float(value)


_SCALARS = (str, int, float, bool)


def _metadata(value: Any) -> dict[str, Any]:
    """A chunk's metadata: field name -> a scalar or a list of scalars."""
    fields = _typed(value, dict, "chunk metadata")
    for name, held in fields.items():
        items = held if isinstance(held, list) else [held]
        if not isinstance(name, str) or not all(isinstance(item, _SCALARS) for item in items):
            raise ValueError("chunk metadata is not fields of scalar values")
    return fields


def _tiers(value: Any) -> tuple[str, ...]:
    tiers = tuple(_typed(t, str, "rerank tier") for t in _typed(value, list, "rerank tiers"))
    if len(tiers) > _MAX_RERANK_TIERS:
        raise RejectedEntry("out_of_bounds", f"{len(tiers)} rerank tiers")
    return tiers


def _loads(raw: bytes) -> dict[str, Any]:
    data = orjson.loads(raw)
    if not isinstance(data, dict) or data.get("s") != KEY_SCHEMA:
        raise ValueError("not an entry of this schema")
    return data


def encode_entry(entry: CachedRetrieval) -> bytes:
    return kept_json(  # an in-process cache keeps these bytes
        {
            "s": KEY_SCHEMA,
            "v": entry.index_version,
            "q": entry.query,
            "t": list(entry.rerank_tiers),
            "d": entry.degraded,
            "p": _passage_rows(entry.passages),
        }
    )


def decode_entry(raw: bytes, top_k: int = 0) -> CachedRetrieval:
    """Every field's shape is checked: RejectedEntry ("malformed", "out_of_bounds") on anything
    unexpected, which the layer counts and treats as a miss. `top_k`: the key's (0: unknown)."""
    try:
        data = _loads(raw)
        if "k" in data:
            raise ValueError(f"an entry of kind {data['k']!r}")
        return CachedRetrieval(
            _passages(data["p"], top_k),
            _typed(data["v"], str, "index version"),
            _tiers(data["t"]),
            _typed(data["q"], str, "query"),
            _typed(data["d"], bool, "degraded"),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise RejectedEntry("malformed", f"unreadable cache entry: {exc}") from exc


def encode_answer(entry: CachedAnswer) -> bytes:
    return kept_json(  # an in-process cache keeps these bytes
        {
            "s": KEY_SCHEMA,
            "k": _ANSWER_KIND,
            "a": entry.text,
            "v": entry.index_version,
            "t": list(entry.rerank_tiers),
            "m": entry.generator_model,
            "u": [
                entry.usage.prompt_tokens,
                entry.usage.completion_tokens,
                entry.usage.prefix_cache_hit_tokens,
                entry.usage.draft_tokens,
                entry.usage.accepted_draft_tokens,
            ],
            "c": [entry.context_tokens, entry.context_tokens_full],
            "p": _passage_rows(entry.passages),
        }
    )


def decode_answer(raw: bytes, top_k: int = 0) -> CachedAnswer:
    """Every field's shape is checked (an answer is streamed verbatim to a client): RejectedEntry
    ("malformed", "out_of_bounds") on anything unexpected, which the layer counts and treats as a miss."""
    try:
        data = _loads(raw)
        if data.get("k") != _ANSWER_KIND:
            raise ValueError("not an answer entry")
        usage = _ints(data["u"], 5, "usage")
        context = _ints(data["c"], 2, "context tokens")
        return CachedAnswer(
            text=_typed(data["a"], str, "text"),
            passages=_passages(data["p"], top_k),
            index_version=_typed(data["v"], str, "index version"),
            rerank_tiers=_tiers(data["t"]),
            usage=Usage(*usage),
            generator_model=_typed(data["m"], str, "generator model"),
            context_tokens=context[0],
            context_tokens_full=context[1],
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise RejectedEntry("malformed", f"unreadable answer cache entry: {exc}") from exc
