"""Entry <-> bytes with orjson, the same for every store (so one contract suite covers both)."""

from __future__ import annotations

from typing import Any

import orjson

from ragserve.cache.base import CacheBackendError, CachedRetrieval
from ragserve.cache.keys import KEY_SCHEMA
from ragserve.types import Chunk, Passage


def encode_entry(entry: CachedRetrieval) -> bytes:
    return orjson.dumps(
        {
            "s": KEY_SCHEMA,
            "v": entry.index_version,
            "q": entry.query,
            "t": list(entry.rerank_tiers),
            "d": entry.degraded,
            "p": [
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
                for p in entry.passages
            ],
        }
    )


def decode_entry(raw: bytes) -> CachedRetrieval:
    """Raises CacheBackendError("decode") on anything unexpected: a bad entry is a miss."""
    try:
        data: dict[str, Any] = orjson.loads(raw)
        if data["s"] != KEY_SCHEMA:
            raise ValueError(f"entry schema {data['s']!r}")
        passages = tuple(
            Passage(Chunk(cid, doc, text, title, source, int(start), int(end)), float(score), int(rank))
            for cid, doc, text, title, source, start, end, score, rank in data["p"]
        )
        return CachedRetrieval(passages, str(data["v"]), tuple(data["t"]), str(data["q"]), bool(data["d"]))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise CacheBackendError("decode", f"unreadable cache entry: {exc}") from exc
