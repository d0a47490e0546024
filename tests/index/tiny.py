"""Tiny index versions published without a model (random unit vectors), to query with the fake
embedder (`FakeEmbedder(dim=DIM)`): enough for format, reload and cache-identity tests that need no MiniLM."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ragserve.digests import sha256_file
from ragserve.index.bm25_build import build_bm25
from ragserve.index.chunk_store import write_chunks
from ragserve.index.format import (
    CHUNKS_FILE,
    HNSW_FILE,
    MANIFEST,
    VECTORS_FILE,
    Manifest,
    latest_version,
    new_build_dir,
    publish,
    resolve_current,
)
from ragserve.index.hnsw_build import build_hnsw
from ragserve.types import Chunk
from tests import fakes

DIM = 8
# A small M gives many elements upper levels, so the upper link lists get exercised too.
TINY_M = 4


def unit_vectors(count: int, seed: int) -> np.ndarray:
    return fakes.unit_vectors(count, seed, DIM)


def publish_tiny(
    root: Path,
    texts: list[str],
    seed: int = 0,
    version: int | None = None,
    bm25: bool = False,
    ships: Callable[[Path], dict[str, Any]] | None = None,
) -> Path:
    """Publish `texts` as the next version of `root` (or as `version`); returns the version folder.
    `ships` writes more files into the build folder (listed with the rest) and returns manifest
    fields to set, e.g. a tuned model and its entry."""
    build = new_build_dir(root)
    build_hnsw(unit_vectors(len(texts), seed), build / HNSW_FILE, m=TINY_M, ef_construction=40)
    write_chunks(build / CHUNKS_FILE, [Chunk(f"c{i}", f"doc-{text[:12]}", text) for i, text in enumerate(texts)])
    np.save(build / VECTORS_FILE, unit_vectors(len(texts), seed), allow_pickle=False)
    names = [HNSW_FILE, CHUNKS_FILE, VECTORS_FILE, *(build_bm25(texts, build) if bm25 else [])]
    extra: dict[str, Any] = {}
    if ships is not None:
        extra = ships(build)
        written = sorted(p.relative_to(build).as_posix() for p in build.rglob("*") if p.is_file())
        names += [name for name in written if name not in names]
    manifest = Manifest(
        version=version if version is not None else latest_version(root) + 1,
        embedder_id=fakes.FakeEmbedder.model_id,
        dim=DIM,
        count=len(texts),
        files={name: sha256_file(build / name) for name in names},
        hnsw={"M": TINY_M, "ef_construction": 40},
        bm25={"library": "bm25s"} if bm25 else {},
        **extra,
    )
    return publish(root, build, manifest)


def rewrite_manifest(root: Path, change: Callable[[dict], object]) -> None:
    """Edit the published manifest as JSON (`change` mutates the dict in place)."""
    path = resolve_current(root) / MANIFEST
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def refresh_checksum(root: Path, name: str) -> None:
    """What a hostile publisher does after editing a file: make the manifest vouch for it."""
    folder = resolve_current(root)
    rewrite_manifest(root, lambda data: data["files"].__setitem__(name, sha256_file(folder / name)))
