"""Kept JSON bytes are orjson's, allocated to their length."""

from __future__ import annotations

import tracemalloc

import orjson

from ragserve.json_bytes import kept_json

RECORD = {"doc_id": "s1", "hash": "x" * 64, "first_row": 1, "chunks": 1, "meta": "y" * 32}


def _allocated(make) -> int:
    tracemalloc.start()
    kept = [make() for _ in range(2000)]
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(kept) == 2000
    return size


def test_the_bytes_are_orjsons_and_take_about_their_length() -> None:
    assert kept_json(RECORD) == orjson.dumps(RECORD)
    assert kept_json({"b": 1, "a": 2}, option=orjson.OPT_SORT_KEYS) == b'{"a":2,"b":1}'
    length = len(orjson.dumps(RECORD))
    # At most twice the length (object header, list slot): not the kilobytes orjson may round up to.
    assert _allocated(lambda: kept_json(RECORD)) < 2000 * 2 * (length + 64)
