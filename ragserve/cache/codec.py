"""Entry <-> bytes with orjson, the same for every store (so one contract suite covers both)."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson

from ragserve.cache.base import CacheBackendError, CachedAnswer, CachedRetrieval
from ragserve.cache.keys import KEY_SCHEMA
from ragserve.types import Chunk, Passage, Usage

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
        ]
        for p in passages
    ]


def _passages(rows: Any) -> tuple[Passage, ...]:
    return tuple(
        Passage(Chunk(cid, doc, text, title, source, int(start), int(end)), float(score), int(rank))
        for cid, doc, text, title, source, start, end, score, rank in rows
    )


def _loads(raw: bytes) -> dict[str, Any]:
    data = orjson.loads(raw)
    if not isinstance(data, dict) or data.get("s") != KEY_SCHEMA:
        raise ValueError("not an entry of this schema")
    return data


def encode_entry(entry: CachedRetrieval) -> bytes:
    return orjson.dumps(
        {
            "s": KEY_SCHEMA,
            "v": entry.index_version,
            "q": entry.query,
            "t": list(entry.rerank_tiers),
            "d": entry.degraded,
            "p": _passage_rows(entry.passages),
        }
    )


def decode_entry(raw: bytes) -> CachedRetrieval:
    """Raises CacheBackendError("decode") on anything unexpected: a bad entry is a miss."""
    try:
        data = _loads(raw)
        if "k" in data:
            raise ValueError(f"an entry of kind {data['k']!r}")
        passages = _passages(data["p"])
        return CachedRetrieval(passages, str(data["v"]), tuple(data["t"]), str(data["q"]), bool(data["d"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise CacheBackendError("decode", f"unreadable cache entry: {exc}") from exc


def encode_answer(entry: CachedAnswer) -> bytes:
    return orjson.dumps(
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


def _typed(value: Any, kind: type[T], what: str) -> T:
    # bool is an int to isinstance: a count must be a real int.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{what} is {type(value).__name__}, not {kind.__name__}")
    return value


def _ints(value: Any, n: int, what: str) -> list[int]:
    if not isinstance(value, list) or len(value) != n:
        raise ValueError(f"{what} is not a list of {n}")
    return [_typed(v, int, what) for v in value]


def decode_answer(raw: bytes) -> CachedAnswer:
    """Every field's shape is checked (an answer is streamed verbatim to a client): CacheBackendError
    ("decode") on anything unexpected, which the layer counts and treats as a miss."""
    try:
        data = _loads(raw)
        if data.get("k") != _ANSWER_KIND:
            raise ValueError("not an answer entry")
        rows = _typed(data["p"], list, "passages")
        for row in rows:
            _typed(row, list, "passage")
            if len(row) != 9 or not all(isinstance(f, str) for f in row[:5]):
                raise ValueError("malformed passage")
        usage = _ints(data["u"], 5, "usage")
        context = _ints(data["c"], 2, "context tokens")
        return CachedAnswer(
            text=_typed(data["a"], str, "text"),
            passages=_passages(rows),
            index_version=_typed(data["v"], str, "index version"),
            rerank_tiers=tuple(_typed(t, str, "rerank tier") for t in _typed(data["t"], list, "rerank tiers")),
            usage=Usage(*usage),
            generator_model=_typed(data["m"], str, "generator model"),
            context_tokens=context[0],
            context_tokens_full=context[1],
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise CacheBackendError("decode", f"unreadable answer cache entry: {exc}") from exc
