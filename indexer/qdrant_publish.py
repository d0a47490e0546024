"""Push a published local index version to Qdrant (a server, a cluster, or local mode).

The local version folder stays the source of truth (incremental builds reuse its vectors); Qdrant
gets every chunk of that version as a new collection, and its alias is flipped once all points are
written (see ragserve/index/qdrant_index.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from indexer.chunking import embedding_text
from ragserve.index.chunk_store import read_chunks
from ragserve.index.format import CHUNKS_FILE, VECTORS_FILE, read_verified_version, require_listed, resolve_current
from ragserve.index.qdrant_write import publish_collection


def publish_folder_to_qdrant(client: Any, name: str, root: Path) -> tuple[str, int]:
    """Returns (collection, Qdrant version)."""
    folder = resolve_current(root)
    manifest, identity = read_verified_version(folder)
    require_listed(folder, manifest, CHUNKS_FILE, VECTORS_FILE)
    chunks = read_chunks(folder / CHUNKS_FILE)
    vectors = np.load(folder / VECTORS_FILE, allow_pickle=False)
    meta = {
        "embedder_id": manifest.embedder_id,
        "dim": manifest.dim,
        "documents": manifest.documents,
        "local_version": manifest.version,
        # What the points are: the local version's identity (its manifest lists every file's sha256).
        "content_id": identity,
        "chunking": manifest.chunking,
        # Filterable fields: the server checks filters against them; each gets a payload index.
        "fields": manifest.fields,
    }
    return publish_collection(
        client,
        name,
        chunks,
        vectors,
        [embedding_text(c) for c in chunks],
        meta,
        hnsw_m=int(manifest.hnsw.get("M", 32)),
        ef_construct=int(manifest.hnsw.get("ef_construction", 200)),
    )
