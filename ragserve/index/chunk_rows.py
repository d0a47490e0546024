"""A folder version's chunk ids -> docstore rows (warming's and fetch's lookups), built once, on
first use: concurrent first calls wait for the one build rather than each making its own."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import orjson

from ragserve.index.format import DOCUMENTS_FILE, Manifest
from ragserve.types import Chunk


class ChunkRows:
    def __init__(self, folder: Path, manifest: Manifest, chunks: Sequence[Chunk]) -> None:
        self._folder, self._manifest, self._chunks = folder, manifest, chunks
        self._rows: dict[str, int] | None = None
        self._decoded = False
        self._lock = threading.Lock()

    def of(self, chunk_ids: Sequence[str]) -> np.ndarray:
        """Each id's row, -1 for one this version lacks: the same work for either."""
        rows = self._rows
        if rows is None:
            with self._lock:
                if self._rows is None:
                    self._rows = self._from_records()
                rows = self._rows
        return np.fromiter((rows.get(c, -1) for c in chunk_ids), dtype=np.int64, count=len(chunk_ids))

    def decode_instead(self) -> None:
        """The records did not name their chunks the indexer's way: ask the chunks themselves (once)."""
        with self._lock:
            if not self._decoded:
                self._rows, self._decoded = self._decoded_rows(), True

    def _from_records(self) -> dict[str, int]:
        """From the indexer's document records (a document's rows, its chunks `doc_id#i` in
        order) when the version has them and they hold; else by decoding every chunk, some 10x
        slower (BENCHMARKS.md, "A million passages")."""
        count = self._manifest.count
        if DOCUMENTS_FILE in self._manifest.files:
            rows: dict[str, int] = {}
            try:
                with (self._folder / DOCUMENTS_FILE).open("rb") as handle:
                    for line in handle:
                        record = orjson.loads(line)
                        doc, first = str(record["doc_id"]), int(record["first_row"])
                        rows.update((f"{doc}#{i}", first + i) for i in range(int(record["chunks"])))
            except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                rows = {}
            if len(rows) == count and all(0 <= row < count for row in rows.values()):
                return rows
        self._decoded = True
        return self._decoded_rows()

    def _decoded_rows(self) -> dict[str, int]:
        return {chunk.chunk_id: row for row, chunk in enumerate(self._chunks)}
