"""What an index version serves with: its index files plus the models it ships, loaded and checked.

A folder version's shipped models are read by `index/shipped.py` (entry, files, checksums, size)
and opened by `embed/tuned.py` and `rerank/tuned.py` from the plain paths it hands them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ragserve.config import RerankSettings, Settings
from ragserve.embed.base import Embedder
from ragserve.embed.tuned import open_tuned_embedder
from ragserve.errors import ConfigError
from ragserve.index.base import SearchIndex
from ragserve.index.format import Manifest
from ragserve.index.fusion import RetrievalOptions
from ragserve.index.hnsw import HnswIndex
from ragserve.index.shipped import EMBEDDER_ENTRY, RERANKER_ENTRY, fitted_weight, shipped_model
from ragserve.request.serving import ServingVersion
from ragserve.rerank.base import RerankerSource, TunedCrossEncoder
from ragserve.rerank.tuned import open_tuned_reranker

if TYPE_CHECKING:
    from ragserve.embed.onnx_backend import OnnxEmbedder

log = logging.getLogger(__name__)

# The most search breadth a version's manifest may ask for: the indexer measures a few hundred at a
# million chunks; a manifest edited to ask for millions would make every search walk the graph.
MAX_MEASURED_EF = 4096


def measured_ef(hnsw: Mapping[str, object], version: str) -> int:
    """The manifest's measured ef_search as a floor, within [0, MAX_MEASURED_EF] (0: none)."""
    value = hnsw.get("ef_search", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        log.warning("index version %s: manifest hnsw.ef_search %r is not a count; ignored", version, value)
        return 0
    if value > MAX_MEASURED_EF:
        log.warning("index version %s: manifest hnsw.ef_search %d cut to %d", version, value, MAX_MEASURED_EF)
        return MAX_MEASURED_EF
    return value


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


def check_compatible(embedder: Embedder, index: SearchIndex) -> None:
    """An index is only meaningful with the embedder that built it: the version's own tuned one if
    it ships one (checked when that was loaded), else the configured one."""
    if index.embedder_id != embedder.model_id or index.dim != embedder.dim:
        raise ConfigError(
            f"index was built with embedder {index.embedder_id!r} (dim {index.dim}) but the server "
            f"is configured with {embedder.model_id!r} (dim {embedder.dim}); re-index or set RAGSERVE_EMBEDDER_MODEL"
        )


def warn_if_backend_differs(embedder: Embedder, manifest: Manifest, version: str) -> bool:
    """Documents embedded by another backend than the questions (torch fp32 against ONNX int8: the
    same model, cosines within about 0.02) still serve, with a warning: refusing them would stop
    every server on an index built before the indexer defaulted to the server's backend."""
    own = str(getattr(embedder, "backend", ""))
    if not own or not manifest.embedder_backend or own == manifest.embedder_backend:
        return False
    log.warning(
        "index version %s: documents were embedded with %s, questions are embedded with %s (same model, "
        "slightly different vectors); rebuild with `ragserve-index build --backend %s%s` to match",
        version, manifest.embedder_backend, own, own.split("-")[0], " --no-int8" if own == "onnx" else "",
    )  # fmt: skip
    return True


class VersionBuilder:
    """What an index version serves with: the index files, plus the tuned query embedder, tuned
    cross-encoder and fitted fusion weight a folder version may ship (a Qdrant version ships none).
    Blocking: loads ONNX models; the caller warms the reranker before the version serves."""

    def __init__(
        self,
        configured: Embedder,
        rerankers: RerankerSource | None,
        options: RetrievalOptions,
        *,
        embedder_threads: int,
        reranker_threads: int = 0,
        reranker_cpus: frozenset[int] | None = None,
    ) -> None:
        self._configured = configured
        self._rerankers = rerankers
        self._options = options
        self._embedder_threads = embedder_threads
        self._reranker_threads = reranker_threads
        self._reranker_cpus = reranker_cpus

    @classmethod
    def from_settings(
        cls, settings: Settings, configured: Embedder, rerankers: RerankerSource | None, options: RetrievalOptions
    ) -> VersionBuilder:
        threads, cpus = rerank_threads(settings.rerank)
        return cls(
            configured,
            rerankers,
            options,
            embedder_threads=settings.embedder.threads,
            reranker_threads=threads,
            reranker_cpus=cpus,
        )

    def __call__(self, index: SearchIndex) -> ServingVersion:
        embedder: Embedder = self._configured
        tuned_reranker = None
        options = self._options
        if isinstance(index, HnswIndex):
            folder, manifest = index.folder, index.manifest
            embedder = load_tuned_embedder(folder, manifest, self._embedder_threads) or embedder
            tuned_reranker = load_tuned_reranker(folder, manifest, self._reranker_threads, self._reranker_cpus)
            options = options.for_version(fitted_weight(folder, manifest), measured_ef(manifest.hnsw, index.version))
        check_compatible(embedder, index)
        if isinstance(index, HnswIndex):
            warn_if_backend_differs(embedder, index.manifest, index.version)
        if embedder is not self._configured:
            log.info(
                "index version %s ships its own tuned query embedder %s: queries use it",
                index.version,
                index.embedder_id,
            )
        reranker = self._rerankers.for_version(index.version, tuned_reranker) if self._rerankers is not None else None
        return ServingVersion(index, embedder, reranker, options)


def serve_version(index: SearchIndex, configured: Embedder, threads: int = 0) -> ServingVersion:
    """A loaded version with the models it ships, as the server would serve it (no reranker
    chosen): for the indexer's tuners, which verify what they publish this way (threads 0: every core)."""
    builder = VersionBuilder(configured, None, RetrievalOptions(), embedder_threads=threads, reranker_threads=threads)
    return builder(index)


def parse_cpus(spec: str, setting: str) -> frozenset[int] | None:
    """ "0", "0,1" or "0-3" -> a CPU set; empty -> None (no pinning)."""
    if not spec.strip():
        return None
    cpus: set[int] = set()
    try:
        for part in spec.split(","):
            lo, _, hi = part.strip().partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError as exc:
        raise ConfigError(f"{setting}={spec!r} is not a CPU list like 1 or 0,1 or 0-3") from exc
    return frozenset(cpus)


def rerank_threads(cfg: RerankSettings) -> tuple[int, frozenset[int] | None]:
    """ONNX Runtime threads per reranker call and the CPUs they are pinned to (RAGSERVE_RERANK_*)."""
    cpus = parse_cpus(cfg.cpus, "RAGSERVE_RERANK_CPUS")
    return cfg.threads or (len(cpus) if cpus else 0), cpus
