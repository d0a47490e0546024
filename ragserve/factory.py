"""Settings -> concrete backends. The only module that picks implementations."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from ragserve.config import Settings
from ragserve.embedding import Embedder, SentenceTransformerEmbedder
from ragserve.errors import ConfigError
from ragserve.generate.base import Generator
from ragserve.index.base import SearchIndex
from ragserve.index.hnsw import HnswIndex
from ragserve.pipeline import RagPipeline

log = logging.getLogger(__name__)


def make_embedder(settings: Settings) -> Embedder:
    return SentenceTransformerEmbedder(settings.embedder_model, device=settings.embedder_device)


def make_index(settings: Settings) -> SearchIndex:
    return HnswIndex.load(settings.index_path)


def make_generator(settings: Settings) -> Generator:
    from ragserve.generate.vllm_engine import VllmGenerator

    return VllmGenerator(settings.generator)


def check_compatible(embedder: Embedder, index: SearchIndex) -> None:
    """An index is only meaningful with the embedder that built it."""
    if index.embedder_id != embedder.model_id or index.dim != embedder.dim:
        raise ConfigError(
            f"index was built with embedder {index.embedder_id!r} (dim {index.dim}) but the server "
            f"is configured with {embedder.model_id!r} (dim {embedder.dim}); re-index or set RAGSERVE_EMBEDDER_MODEL"
        )


def make_pipeline(settings: Settings, with_generator: bool = True) -> RagPipeline:
    """Load and wire every part; the generator is started separately (it is async)."""
    embedder = make_embedder(settings)
    index = make_index(settings)
    check_compatible(embedder, index)
    log.info("index version %s loaded: %d chunks from %s", index.version, index.count, settings.index_path)
    generator = make_generator(settings) if with_generator else None
    executor = ThreadPoolExecutor(max_workers=settings.model_threads, thread_name_prefix="ragserve-model")
    return RagPipeline(embedder, index, generator, executor, ef_search=settings.hnsw_ef_search)
