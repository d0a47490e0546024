"""Checkpoints of a build in progress: each embedded group of documents (chunks and vectors) is
written into the index root as it finishes, so a build that was interrupted (Ctrl-C, SIGKILL, a
lost machine) resumes without embedding those documents again.

    <root>/.checkpoints/<settings>/<sha256>.group

`<settings>` is a digest of the embedder id, backend, vector width and chunking: a checkpoint made
with other settings is never looked at. A file is named by the SHA-256 of its bytes, written to a
temporary name and renamed, and read only while its bytes still match that name: a torn or corrupt
file is skipped (its documents are embedded again), never trusted. Each document in it is reused
only if its content hash is the one the source has now. Nothing here is ever published as it is:
the build assembles a version from it like from freshly embedded documents, and the folder is
removed once that version is published.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from ragserve.errors import IndexLoadError
from ragserve.index.chunk_store import chunk_record, decode_chunk
from ragserve.types import Chunk

log = logging.getLogger(__name__)

CHECKPOINTS = ".checkpoints"
SUFFIX = ".group"
FORMAT = 2  # 2: chunks carry their location in the source


@dataclass(frozen=True)
class Embedded:
    """One document's chunks and their vectors (one row per chunk), as the embedder made them."""

    doc_id: str
    content_hash: str
    chunks: list[Chunk]
    vectors: np.ndarray


def settings_key(settings: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(settings, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


class Checkpoints:
    """The checkpoints of builds into one index root with one set of embedding settings."""

    def __init__(self, root: Path, settings: dict[str, Any], dim: int) -> None:
        self._settings = settings
        self._dim = dim
        self.folder = root / CHECKPOINTS / settings_key(settings)
        self._index: dict[str, tuple[str, Path]] = {}
        self._last: tuple[Path | None, dict[str, Embedded]] = (None, {})

    def index(self) -> dict[str, tuple[str, Path]]:
        """Each document a readable checkpoint holds: its content hash and file. Only the files'
        headers are kept: `take` reads a document's vectors when the build reaches it."""
        found: dict[str, tuple[str, Path]] = {}
        for path in self._files():
            for item in self._read(path):
                found[item.doc_id] = (item.content_hash, path)
        self._index = found
        return found

    def take(self, doc_id: str, content_hash: str) -> Embedded | None:
        """The document as `index` found it, if its content hash is still `content_hash`. The last
        file read is kept: a build reaches a group's documents one after the other."""
        hit = self._index.get(doc_id)
        if hit is None or hit[0] != content_hash:
            return None
        if self._last[0] != hit[1]:
            self._last = (hit[1], {item.doc_id: item for item in self._read(hit[1])})
        return self._last[1].get(doc_id)

    def _files(self) -> list[Path]:
        return sorted(self.folder.glob(f"*{SUFFIX}")) if self.folder.is_dir() else []

    def save(self, group: list[Embedded]) -> None:
        """Write one group atomically: a reader sees the whole file or none of it."""
        if not group:
            return
        docs = [
            {
                "doc_id": e.doc_id,
                "hash": e.content_hash,
                "chunks": [orjson.loads(chunk_record(c, c.sentences)) for c in e.chunks],
            }
            for e in group
        ]
        header = {"format": FORMAT, "settings": self._settings, "dim": self._dim, "docs": docs}
        matrix = np.ascontiguousarray(np.concatenate([e.vectors for e in group]), dtype="<f4")
        data = orjson.dumps(header) + b"\n" + matrix.tobytes()
        self.folder.mkdir(parents=True, exist_ok=True)
        target = self.folder / f"{hashlib.sha256(data).hexdigest()}{SUFFIX}"
        tmp = self.folder / f".{target.name}.{os.getpid()}.tmp"
        with tmp.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)

    def _read(self, path: Path) -> list[Embedded]:
        try:
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() != path.name.removesuffix(SUFFIX):
                raise ValueError("its bytes do not match its name (torn or corrupt)")
            return self._parse(data)
        except (OSError, ValueError, TypeError, KeyError, IndexLoadError) as exc:  # orjson's errors are ValueErrors
            log.warning("ignoring build checkpoint %s: %s", path, exc)
            return []

    def _parse(self, data: bytes) -> list[Embedded]:
        head, _, body = data.partition(b"\n")
        header = orjson.loads(head)
        if header.get("format") != FORMAT or header.get("settings") != self._settings or header["dim"] != self._dim:
            raise ValueError("made with other settings")
        rows = sum(len(d["chunks"]) for d in header["docs"])
        if len(body) != rows * self._dim * 4:
            raise ValueError(f"holds {len(body)} bytes of vectors for {rows} chunks")
        matrix = np.frombuffer(body, dtype="<f4").reshape(rows, self._dim).astype(np.float32)
        items: list[Embedded] = []
        row = 0
        for doc in header["docs"]:
            chunks = [decode_chunk(orjson.dumps(c), "a build checkpoint") for c in doc["chunks"]]
            items.append(Embedded(str(doc["doc_id"]), str(doc["hash"]), chunks, matrix[row : row + len(chunks)]))
            row += len(chunks)
        return items


def clear_checkpoints(root: Path) -> None:
    """After a publish: what the checkpoints held is in the published version now."""
    shutil.rmtree(root / CHECKPOINTS, ignore_errors=True)
