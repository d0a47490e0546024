"""The models an index version ships, opened: its files read and checked by `index/shipped.py`,
then handed as plain paths to `embed/tuned.py` and `rerank/tuned.py`. The factory's VersionBuilder,
the tuners and the benchmarks load a version's models through here."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ragserve.embed.tuned import open_tuned_embedder
from ragserve.index.format import Manifest
from ragserve.index.shipped import EMBEDDER_ENTRY, RERANKER_ENTRY, shipped_model
from ragserve.rerank.base import TunedCrossEncoder
from ragserve.rerank.tuned import open_tuned_reranker

if TYPE_CHECKING:
    from ragserve.embed.onnx_backend import OnnxEmbedder


def load_tuned_embedder(folder: Path, manifest: Manifest, threads: int) -> OnnxEmbedder | None:
    """The version's own query embedder, or None when it ships none. `manifest` must come from
    `read_verified_version` (so every listed file has passed its checksum)."""
    model = shipped_model(folder, manifest, EMBEDDER_ENTRY)
    return None if model is None else open_tuned_embedder(model, manifest.embedder_id, manifest.dim, threads)


def load_tuned_reranker(
    folder: Path, manifest: Manifest, threads: int, cpus: frozenset[int] | None = None
) -> TunedCrossEncoder | None:
    """The version's tuned cross-encoder, or None when it ships none (manifest as above)."""
    model = shipped_model(folder, manifest, RERANKER_ENTRY)
    return None if model is None else open_tuned_reranker(model, threads, cpus)
