"""Settings -> concrete backends. The only package that picks implementations: the parts
(`parts.py`), what an index version serves with (`versions.py`) and the wired pipeline
(`pipeline.py`)."""

from ragserve.factory.parts import (
    make_answer_cache,
    make_cache,
    make_cache_store,
    make_embedder,
    make_entry_seal,
    make_generator,
    make_index,
    make_index_watch,
    make_reranker,
    make_rerankers,
    make_retrieval_first,
    make_retrieval_options,
    make_tuned_reranker,
)
from ragserve.factory.pipeline import assemble_pipeline, hot_passages_path, make_pipeline
from ragserve.factory.versions import (
    VersionBuilder,
    check_compatible,
    load_tuned_embedder,
    load_tuned_reranker,
    parse_cpus,
    rerank_threads,
    serve_version,
)

__all__ = [
    "VersionBuilder",
    "assemble_pipeline",
    "check_compatible",
    "hot_passages_path",
    "load_tuned_embedder",
    "load_tuned_reranker",
    "make_answer_cache",
    "make_cache",
    "make_cache_store",
    "make_embedder",
    "make_entry_seal",
    "make_generator",
    "make_index",
    "make_index_watch",
    "make_pipeline",
    "make_reranker",
    "make_rerankers",
    "make_retrieval_first",
    "make_retrieval_options",
    "make_tuned_reranker",
    "parse_cpus",
    "rerank_threads",
    "serve_version",
]
