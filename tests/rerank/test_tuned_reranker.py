"""A version that ships a tuned cross-encoder: loaded and checked with the version, served per
RAGSERVE_RERANK_MODE with the blend of its score and the fused score, swapped on hot reload, and
refused like a corrupt index file when anything about it is off. Uses a tiny random BERT
cross-encoder (tests/index/tuned_fake.py) on a tiny index queried with the fake embedder."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ragserve.budget import Deadline, RequestContext
from ragserve.config import RerankSettings, Settings
from ragserve.errors import IndexLoadError
from ragserve.factory import VersionBuilder, assemble_pipeline, load_tuned_reranker, make_rerankers
from ragserve.index.format import resolve_current
from ragserve.index.fusion import RetrievalOptions
from ragserve.index.hnsw import HnswIndex
from ragserve.index.reload import FolderWatch, IndexReloader
from ragserve.request.pipeline import RagPipeline
from ragserve.request.serving import ServingVersion
from ragserve.rerank.base import TunedCrossEncoder
from ragserve.rerank.blend import blend, blended_order, normalized_fused
from ragserve.rerank.cost import CostModel
from ragserve.rerank.cross_encoder import RANDOM_HEAD_MARKER
from ragserve.rerank.per_version import VersionRerankers
from ragserve.rerank.tiered import Tier, TieredReranker
from ragserve.rerank.tuned import TUNED_DIR, TUNED_ONNX, tuned_reranker_id
from ragserve.types import RetrievalResult, RetrieveParams
from tests.fakes import FakeCrossEncoder, FakeEmbedder
from tests.index.tiny import DIM, publish_tiny, refresh_checksum, rewrite_manifest
from tests.index.tuned_fake import TINY_TEXTS, save_fake_tuned_reranker, ships_tuned_reranker

TEXTS = TINY_TEXTS
QUERY = "what causes the tides of the ocean"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("fake-tuned-reranker")
    return {
        "plain": save_fake_tuned_reranker(base / "plain"),
        "random-head": save_fake_tuned_reranker(base / "random-head", random_head=True),
    }


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2) as pool:
        yield pool


def publish(root: Path, model: Path | None, seed: int = 0, **entry: Any) -> Path:
    ships = ships_tuned_reranker(model, **entry) if model is not None else None
    return publish_tiny(root, TEXTS, seed=seed, bm25=True, ships=ships)


def serve(index: HnswIndex, executor: ThreadPoolExecutor, mode: str) -> RagPipeline:
    """A started pipeline whose reranker choice is the factory's for `mode`: fixed depth, and all
    candidates in one batch (int8 activations are quantized per batch, so a score depends a
    little on its batch: one batch lets the test score the pairs exactly as served)."""
    rerank = RerankSettings(mode=mode, depth_policy="fixed", batch_size=len(TEXTS))  # type: ignore[arg-type]
    settings = Settings(rerank=rerank)
    embedder, rerankers = FakeEmbedder(dim=DIM), make_rerankers(settings)
    versions = VersionBuilder.from_settings(settings, embedder, rerankers, RetrievalOptions())
    pipeline = assemble_pipeline(embedder, index, None, executor, rerankers=rerankers, versions=versions)
    asyncio.run(pipeline.astart())
    return pipeline


def tuned_of(index: HnswIndex) -> TunedCrossEncoder | None:
    """The tuned cross-encoder a loaded version ships (as the factory loads it), or None."""
    return load_tuned_reranker(index.folder, index.manifest, threads=1)


def load_version(root: Path, mode: str = "auto") -> ServingVersion:
    """The published version as the server loads it: index files, then the models it ships."""
    settings = Settings(rerank=RerankSettings(mode=mode))  # type: ignore[arg-type]
    builder = VersionBuilder.from_settings(
        settings, FakeEmbedder(dim=DIM), make_rerankers(settings), RetrievalOptions()
    )
    return builder(HnswIndex.load(root))


def retrieve(pipeline: RagPipeline) -> RetrievalResult:
    params = RetrieveParams(QUERY, top_k=len(TEXTS), budget_ms=60_000)
    return asyncio.run(pipeline.retrieve(params, RequestContext(Deadline(60_000))))


def ids(result: RetrievalResult) -> list[str]:
    return [p.chunk.chunk_id for p in result.passages]


def test_version_loads_with_its_tuned_cross_encoder(tmp_path: Path, models: dict[str, Path]) -> None:
    root = tmp_path / "idx"
    publish(root, None)
    assert tuned_of(HnswIndex.load(root)) is None
    publish(root, models["plain"], ce_weight=0.25)
    index = HnswIndex.load(root)
    tuned = tuned_of(index)
    assert tuned is not None
    assert tuned.model_id == tuned_reranker_id("fake-ce-base", index.manifest.files[TUNED_ONNX])
    assert tuned.model_id.startswith("fake-ce-base+reranker-") and tuned.encoder.model_id == tuned.model_id
    assert (tuned.ce_weight, tuned.beats_fused, tuned.max_seq_len) == (0.25, True, 128)
    assert tuned.encoder.backend == "onnx-int8" and not tuned.encoder.random_head


def test_tuned_version_is_served_in_blended_order(
    tmp_path: Path, models: dict[str, Path], executor: ThreadPoolExecutor
) -> None:
    root = tmp_path / "idx"
    publish(root, models["plain"], ce_weight=0.5)
    index = HnswIndex.load(root)
    fused = retrieve(serve(index, executor, "off"))
    assert fused.rerank_tiers == [] and len(fused.passages) == len(TEXTS)
    pipeline = serve(index, executor, "auto")
    served = retrieve(pipeline)
    assert served.rerank_tiers == [f"tier1:{len(TEXTS)}"]
    tuned = tuned_of(index)
    assert tuned is not None
    logits = tuned.encoder.score(tuned.encoder.encode(QUERY, [p.chunk.text for p in fused.passages]))
    fused_scores = [p.score for p in fused.passages]
    expected = [ids(fused)[i] for i in blended_order(logits.tolist(), fused_scores, 0.5)]
    assert ids(served) == expected
    assert expected != ids(fused)  # the model moved something: the test shows the blend, not the fused order
    blended = dict(zip(ids(fused), blend(logits, normalized_fused(fused_scores), 0.5), strict=True))
    assert [p.score for p in served.passages] == pytest.approx([blended[i] for i in ids(served)], abs=1e-6)
    # Info and the cache scope: the version's model, the mode and the depth.
    assert pipeline.reranker is not None and tuned.model_id in pipeline.reranker.describe()[0]
    assert "ce_weight=0.5" in pipeline.reranker.describe()[0]
    assert "version's tuned cross-encoder (auto) max_depth=20 fixed-depth" in pipeline.caches.scope.ranking


def test_ce_weight_zero_serves_the_fused_order(
    tmp_path: Path, models: dict[str, Path], executor: ThreadPoolExecutor
) -> None:
    root = tmp_path / "idx"
    publish(root, models["plain"], ce_weight=0)
    index = HnswIndex.load(root)
    fused = retrieve(serve(index, executor, "off"))
    served = retrieve(serve(index, executor, "auto"))
    assert served.rerank_tiers == [f"tier1:{len(TEXTS)}"]
    assert ids(served) == ids(fused)


def test_auto_leaves_a_model_that_did_not_beat_the_fused_order_out_and_tuned_uses_it(
    tmp_path: Path, models: dict[str, Path], executor: ThreadPoolExecutor, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "idx"
    publish(root, models["plain"], ce_weight=1.0, beats_fused=False)
    index = HnswIndex.load(root)
    fused = retrieve(serve(index, executor, "off"))
    with caplog.at_level(logging.INFO, logger="ragserve.rerank.per_version"):
        auto = serve(index, executor, "auto")
    assert "did not beat the fused order" in caplog.text
    assert auto.reranker is None
    result = retrieve(auto)
    assert result.rerank_tiers == [] and ids(result) == ids(fused)
    measured = retrieve(serve(index, executor, "tuned"))
    assert measured.rerank_tiers == [f"tier1:{len(TEXTS)}"] and ids(measured) != ids(fused)


def test_configured_modes_ignore_the_version_model_and_tuned_mode_warns_without_one(
    tmp_path: Path, models: dict[str, Path], executor: ThreadPoolExecutor, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "idx"
    publish(root, models["plain"])
    assert serve(HnswIndex.load(root), executor, "off").reranker is None
    publish(root, None, seed=1)
    with caplog.at_level(logging.WARNING, logger="ragserve.rerank.per_version"):
        pipeline = serve(HnswIndex.load(root), executor, "tuned")
    assert "ships no tuned cross-encoder" in caplog.text
    assert pipeline.reranker is None and retrieve(pipeline).rerank_tiers == []


def _flip_a_byte(root: Path) -> None:
    path = resolve_current(root) / TUNED_ONNX
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _unlisted_file(root: Path) -> None:
    (resolve_current(root) / TUNED_DIR / "added_tokens.json").write_text("{}")


def _no_config(root: Path) -> None:
    (resolve_current(root) / TUNED_DIR / "config.json").unlink()
    rewrite_manifest(root, lambda data: data["files"].pop(f"{TUNED_DIR}/config.json"))


def _random_head(root: Path) -> None:
    config = resolve_current(root) / TUNED_DIR / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), RANDOM_HEAD_MARKER: True}))
    refresh_checksum(root, f"{TUNED_DIR}/config.json")


def _entry(**change: object) -> Any:
    return lambda root: rewrite_manifest(root, lambda data: data["tuned_reranker"].update(change))


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (_flip_a_byte, "fails its checksum"),
        (_unlisted_file, "added_tokens.json is not listed"),
        (_no_config, "config.json is missing"),
        (_random_head, "random-head test model"),
        (_entry(ce_weight=1.5), "ce_weight"),
        (_entry(ce_weight=-0.1), "ce_weight"),
        (_entry(ce_weight="0.5"), "ce_weight"),
        (_entry(ce_weight=True), "ce_weight"),
        (_entry(ce_weight=math.nan), "ce_weight"),
        (_entry(beats_fused=1), "beats_fused"),
        (_entry(layers=3), "layers"),
        # Past any MiniLM's positions: refused as the version is read, before a probe of that
        # length is built (10^9 would take ~16 GB at load).
        (_entry(max_seq_len=100_000), "max_seq_len 100000 is not a whole number in 16..512"),
        (_entry(max_seq_len=8), "max_seq_len"),
        (_entry(dir="../reranker", onnx="../reranker/model.int8.onnx"), "not a plain path"),
        (_entry(onnx="reranker/other.onnx"), "not listed"),
    ],
)
def test_a_spoiled_tuned_cross_encoder_is_refused(
    tmp_path: Path, models: dict[str, Path], spoil: Any, message: str
) -> None:
    root = tmp_path / "idx"
    publish(root, models["plain"])
    spoil(root)
    with pytest.raises(IndexLoadError, match=message):
        load_version(root)


def test_a_version_without_an_entry_field_is_refused(tmp_path: Path, models: dict[str, Path]) -> None:
    root = tmp_path / "idx"
    publish(root, models["plain"])
    rewrite_manifest(root, lambda data: data["tuned_reranker"].pop("base"))
    with pytest.raises(IndexLoadError, match="base is missing"):
        load_version(root)


def test_hot_reload_brings_the_version_reranker_warmed_before_it_serves(
    tmp_path: Path,
    models: dict[str, Path],
    executor: ThreadPoolExecutor,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    root = tmp_path / "idx"
    publish(root, None)
    pipeline = serve(HnswIndex.load(root), executor, "auto")
    reloader = IndexReloader(FolderWatch(root), pipeline, clock=lambda: 0.0)
    untuned = pipeline.index
    untuned_serving = pipeline.serving
    assert pipeline.reranker is None and retrieve(pipeline).rerank_tiers == []

    warmed_while_serving: list[str] = []
    warm_up = TieredReranker.warm_up

    def recording_warm_up(self: TieredReranker) -> None:
        warmed_while_serving.append(pipeline.index.identity)
        warm_up(self)

    monkeypatch.setattr(TieredReranker, "warm_up", recording_warm_up)
    publish(root, models["plain"])
    with caplog.at_level(logging.INFO, logger="ragserve.rerank.per_version"):
        assert reloader.check_once()
    assert "reranked by its tuned cross-encoder" in caplog.text
    tuned = pipeline.index
    assert tuned.identity != untuned.identity
    assert warmed_while_serving == [untuned.identity]  # measured before the swap, not by a request
    reranker = pipeline.reranker
    assert isinstance(reranker, TieredReranker) and all(t.cost is not None for t in reranker.tiers)
    assert retrieve(pipeline).rerank_tiers == [f"tier1:{len(TEXTS)}"]
    assert len(warmed_while_serving) == 1
    # A request still holding the old version keeps that version's (no) reranker.
    assert untuned_serving.index is untuned and untuned_serving.reranker is None

    # The next version ships a random-head model: refused, the tuned one keeps serving with its reranker.
    publish(root, models["random-head"], seed=2)
    assert not reloader.check_once()
    assert reloader.refused == 1 and pipeline.index is tuned and pipeline.reranker is reranker


def _fake_tuned(beats_fused: bool) -> TunedCrossEncoder:
    return TunedCrossEncoder(FakeCrossEncoder("fake-tuned"), 0.5, beats_fused, "fake-tuned", 128)  # type: ignore[arg-type]


def _one_tier(tuned: TunedCrossEncoder) -> TieredReranker:
    tier = Tier("tier1", tuned.encoder, 20, 4, CostModel(0.01), ce_weight=tuned.ce_weight)
    return TieredReranker([tier], candidates=20, reserve_ms=0.0)


@pytest.mark.parametrize(
    ("require", "beats_fused", "reranks"), [(True, True, True), (True, False, False), (False, False, True)]
)
def test_auto_needs_a_model_that_beat_the_fused_order_tuned_does_not(
    require: bool, beats_fused: bool, reranks: bool
) -> None:
    source = VersionRerankers(_one_tier, require_beats_fused=require, tag="t")
    assert (source.for_version("v", _fake_tuned(beats_fused)) is not None) is reranks
    assert source.for_version("u", None) is None
    assert source.cache_tags() == ("t",)


def test_a_stated_max_length_the_graph_cannot_take_is_refused_at_load(tmp_path: Path) -> None:
    """The version says 512 tokens a pair (and its config.json agrees); the exported graph has
    256 positions. One full-length pair at load finds it, not the first long passage as INTERNAL."""
    root = tmp_path / "idx"
    publish(root, save_fake_tuned_reranker(tmp_path / "short", positions=256), max_seq_len=512)
    config = resolve_current(root) / TUNED_DIR / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "max_position_embeddings": 512}))
    refresh_checksum(root, f"{TUNED_DIR}/config.json")
    with pytest.raises(IndexLoadError, match="cannot be loaded"):
        load_version(root)
