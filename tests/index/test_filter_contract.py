"""Filtered search, one contract on every index backend: what passes the filter, and only that.

A small corpus with front matter and sidecar metadata is indexed with the real MiniLM; each
backend is asked the same filtered questions, and a property test sends random filters and checks
every hit against the filter's meaning (ragserve/filters.py `matches`) and the exact filtered top-k.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from indexer.build import build_index
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.filters import FieldSchema, Filter, both, matches, parse_filter
from ragserve.index.base import SearchIndex
from ragserve.index.fusion import RetrievalOptions, hybrid_search, plan_breadth
from ragserve.index.hnsw import DEFAULT_EXACT_SCAN_MAX, HnswIndex
from ragserve.index.qdrant_index import QdrantIndex
from tests.index.test_contract import publish_to_qdrant

TOPICS = ["alpha particles", "beta decay", "gamma rays", "ocean tides", "sourdough bread", "bloom filters"]
LANGS = ["en", "de", "fr"]
GROUPS = [["eng"], ["eng", "ops"], ["hr"], ["public"], [], ["ops"]]


def _doc(i: int) -> tuple[str, str]:
    topic = TOPICS[i % len(TOPICS)]
    groups = GROUPS[i % len(GROUPS)]
    front = [
        "---",
        f"lang: {LANGS[i % 3]}",
        f"year: {2015 + i % 9}",
        f"score: {i / 4}",
        f"draft: {'true' if i % 4 == 0 else 'false'}",
        f"published: 2024-0{1 + i % 9}-15",
    ]
    if groups:
        front.append(f"groups: [{', '.join(groups)}]")
    body = f"# Note {i} on {topic}\nThis note {i} explains {topic} in some detail, with facts about {topic}."
    return f"note{i:02d}.md", "\n".join([*front, "---", body])


@pytest.fixture(scope="module")
def filtered_root(tmp_path_factory: pytest.TempPathFactory, embedder: SentenceTransformerEmbedder) -> Path:
    docs = tmp_path_factory.mktemp("filtered-docs")
    for i in range(36):
        name, text = _doc(i)
        (docs / name).write_text(text)
    # A sidecar wins over front matter.
    (docs / "note00.md.meta.json").write_text(json.dumps({"lang": "it"}))
    root = tmp_path_factory.mktemp("filtered-index") / "idx"
    build_index(docs, root, embedder, progress=False)
    return root


@pytest.fixture(params=["hnsw", "qdrant-memory"], scope="module")
def index(request: pytest.FixtureRequest, filtered_root: Path) -> Iterator[SearchIndex]:
    if request.param == "hnsw":
        yield HnswIndex.load(filtered_root)
        return
    from qdrant_client import QdrantClient

    client = QdrantClient(":memory:")
    publish_to_qdrant(client, "docs", filtered_root)
    yield QdrantIndex.open(client, "docs")
    client.close()


def _all_chunks(index: SearchIndex) -> list:
    return index.chunks_in_order(index.count)


def test_fields_come_from_the_metadata_with_their_types(index: SearchIndex) -> None:
    assert dict(index.fields) == {
        "draft": "bool",
        "file_type": "keyword",
        "folder": "keyword",
        "groups": "keyword",
        "lang": "keyword",
        "modified": "datetime",
        "path": "keyword",
        "published": "datetime",
        "score": "float",
        "title": "keyword",
        "year": "integer",
    }
    first = next(c for c in _all_chunks(index) if c.doc_id == "note00.md")
    assert first.metadata["lang"] == "it"  # the sidecar's value
    assert first.metadata["published"] == "2024-01-15T00:00:00+00:00"


def test_a_selective_filter_still_fills_top_k(index: SearchIndex, embedder: SentenceTransformerEmbedder) -> None:
    """Filtering happens inside each retriever, before fusion: not a post-filter of the unfiltered top k."""
    flt = parse_filter({"must": [{"key": "lang", "match": {"value": "fr"}}]}, index.fields)
    query = "gamma rays photons"
    vector = embedder.embed_queries([query])[0]
    options = RetrievalOptions(mode="hybrid")
    for k in (3, 10):
        hits = hybrid_search(
            index, query, vector, plan_breadth(options, "hybrid", k, 64, False), options, "hybrid", False, flt
        )
        assert len(hits) == k
        assert all(h.chunk.metadata["lang"] == "fr" for h in hits)
    dense = index.search(vector, 5, 64, flt)
    assert len(dense) == 5 and all(h.chunk.metadata["lang"] == "fr" for h in dense)
    lexical = index.search_lexical(query, 5, flt)
    assert lexical and all(h.chunk.metadata["lang"] == "fr" for h in lexical)
    assert index.count_matching(flt) == sum(c.metadata.get("lang") == "fr" for c in _all_chunks(index))


def test_a_filter_no_chunk_passes_finds_nothing(index: SearchIndex, embedder: SentenceTransformerEmbedder) -> None:
    flt = parse_filter({"must": [{"key": "year", "range": {"gt": 3000}}]}, index.fields)
    assert index.search(embedder.embed_queries(["tides"])[0], 5, 64, flt) == []
    assert index.search_lexical("tides", 5, flt) == []
    assert index.count_matching(flt) == 0


def test_a_field_the_version_lacks_matches_no_chunk(index: SearchIndex, embedder: SentenceTransformerEmbedder) -> None:
    """An access grant on a field the index does not declare reads nothing (fails closed)."""
    from ragserve.access import AccessPolicy

    grant = AccessPolicy("readers", {"svc": ("eng",)}).grant_for({"svc"})
    assert index.search(embedder.embed_queries(["tides"])[0], 5, 64, grant) == []
    assert index.search_lexical("tides", 5, grant) == []


def test_a_grant_reads_its_groups_and_the_public_ones(
    index: SearchIndex, embedder: SentenceTransformerEmbedder
) -> None:
    from ragserve.access import AccessPolicy

    policy = AccessPolicy("groups", {"hr-svc": ("hr",)})
    grant = policy.grant_for({"hr-svc"})
    vector = embedder.embed_queries(["notes"])[0]
    hits = index.search(vector, 50, 64, grant)
    assert hits and {tuple(h.chunk.metadata["groups"]) for h in hits} == {("hr",), ("public",)}
    nobody = index.search(vector, 50, 64, policy.grant_for(set()))
    assert nobody and all(h.chunk.metadata["groups"] == ["public"] for h in nobody)
    # The caller's own filter cannot widen its grant: both must hold.
    wide = parse_filter({"should": [{"key": "groups", "match": {"value": "eng"}}]}, index.fields)
    assert index.search(vector, 50, 64, both(wide, policy.grant_for(set()))) == []


_KEYS = ["lang", "year", "score", "draft", "published", "groups"]


@st.composite
def _conditions(draw: st.DrawFn, depth: int = 0) -> dict:
    key = draw(st.sampled_from(_KEYS))
    kind = draw(st.sampled_from(["match", "any", "range", "exists"] + (["filter"] if depth < 2 else [])))
    if kind == "filter":
        return {"filter": draw(_filters(depth + 1))}
    if kind == "exists":
        return {"key": key, "exists": draw(st.booleans())}
    values = {
        "lang": st.sampled_from([*LANGS, "it", "xx"]),
        "year": st.integers(2014, 2024),
        "score": st.sampled_from([i / 4 for i in range(0, 40, 3)]),
        "draft": st.booleans(),
        "published": st.sampled_from([f"2024-0{m}-15" for m in range(1, 10)]),
        "groups": st.sampled_from(["eng", "ops", "hr", "public", "nobody"]),
    }[key]
    if kind == "range" and key in ("year", "score", "published"):
        bound = draw(st.sampled_from(["gt", "gte", "lt", "lte"]))
        return {"key": key, "range": {bound: draw(values)}}
    if kind == "any":
        return {"key": key, "match": {"any": draw(st.lists(values, min_size=1, max_size=3))}}
    return {"key": key, "match": {"value": draw(values)}}


@st.composite
def _filters(draw: st.DrawFn, depth: int = 0) -> dict:
    part = st.lists(_conditions(depth), max_size=2)
    return {"must": draw(part), "should": draw(part), "must_not": draw(part)}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=_filters())
def test_every_hit_passes_a_random_filter_and_none_that_passes_is_missed(
    index: SearchIndex, embedder: SentenceTransformerEmbedder, raw: dict
) -> None:
    schema = FieldSchema(index.fields)
    flt = parse_filter(raw, schema)
    chunks = _all_chunks(index)
    passing = {c.chunk_id for c in chunks if matches(flt, c.metadata, schema)}
    vector = _vector(embedder)
    dense = index.search(vector, 8, 64, flt)
    assert {h.chunk.chunk_id for h in dense} <= passing
    assert len(dense) == min(8, len(passing))  # a small corpus: exact, every backend
    lexical = index.search_lexical("bread starter yeast", 8, flt)
    assert {h.chunk.chunk_id for h in lexical} <= passing
    assert index.count_matching(flt) == len(passing)
    if isinstance(index, HnswIndex):  # the filtered HNSW walk (above the exact-scan size) keeps to the filter too
        index.exact_scan_max = 0
        try:
            walked = index.search(vector, 8, 64, flt)
        finally:
            index.exact_scan_max = DEFAULT_EXACT_SCAN_MAX
        assert {h.chunk.chunk_id for h in walked} <= passing
        if passing:
            exact = {h.chunk.chunk_id for h in dense}
            assert len({h.chunk.chunk_id for h in walked} & exact) >= min(len(exact), 8) - 1


_VECTORS: dict[str, np.ndarray] = {}


def _vector(embedder: SentenceTransformerEmbedder) -> np.ndarray:
    if "q" not in _VECTORS:
        _VECTORS["q"] = embedder.embed_queries(["sourdough bread rises with yeast"])[0]
    return _VECTORS["q"]


def test_nothing_passes_an_empty_should_list_requirement(index: SearchIndex) -> None:
    """Filter() is the whole corpus; `both` of nothing narrows nothing."""
    assert both(None, None) is None
    assert index.count_matching(Filter()) == index.count
