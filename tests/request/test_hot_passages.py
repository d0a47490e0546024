"""Retrieval counts and pre-filling the engine's prefix cache with the most retrieved passages."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from indexer.build import build_index
from ragserve.budget import Deadline, RequestContext
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.events import GenerationChunk, Usage
from ragserve.factory import assemble_pipeline
from ragserve.index.hnsw import HnswIndex
from ragserve.index.reload import FolderWatch, IndexReloader
from ragserve.prompt import Prompt, build_prompt
from ragserve.reports import WarmState
from ragserve.request.hot import HotPassages
from ragserve.request.pipeline import RagPipeline
from ragserve.request.policy import AnswerPolicy
from ragserve.types import GenerateParams, Passage, RetrieveParams
from tests.fakes import FakeGenerator
from tests.index.conftest import write_docs


def test_counts_persist_and_survive_a_bad_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "hot-passages.json"
    hot = HotPassages(path)
    for chunk_id in ["a", "b", "b", "c", "b", "c"]:
        hot.record(chunk_id)
    hot.save()
    again = HotPassages(path)
    again.load()
    assert again.top(2) == ["b", "c"]
    path.write_text("{not json")
    broken = HotPassages(path)
    with caplog.at_level(logging.WARNING):
        broken.load()
    assert broken.top(5) == [] and "counting starts over" in caplog.text
    for bad in ('{"format": 1, "counts": {"a": "many"}}', '{"format": 2, "counts": {}}', "[1, 2]"):
        path.write_text(bad)
        refused = HotPassages(path)
        refused.load()
        assert refused.top(5) == []
    path.write_text('{"format": 1, "counts": {"a": 1}, "pad": "' + "x" * (9 << 20) + '"}')
    oversized = HotPassages(path)
    oversized.load()
    assert oversized.top(5) == []


@pytest.mark.parametrize(
    "text",
    [
        '{"format": 1, "counts": {"a": Infinity}}',
        '{"format": 1, "counts": {"a": 1e400}}',
        '{"format": 1, "counts": {"a": 2.5}}',
        '{"format": 1, "counts": {"a": true}}',
        '{"format": 1, "counts": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"format": 1, "counts": {"a": ' + "9" * 5000 + "}}",
    ],
    ids=["infinity", "overflow", "float", "bool", "deep", "huge-int"],
)
def test_any_bad_counts_file_means_no_counts_never_a_failed_start(
    tmp_path: Path, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "hot.json"
    path.write_text(text)
    hot = HotPassages(path)
    with caplog.at_level(logging.WARNING):
        hot.load()  # used to raise OverflowError / RecursionError and stop start-up
    assert hot.top(5) == [] and "counting starts over" in caplog.text


def test_counts_decay_so_old_repeats_give_way() -> None:
    hot = HotPassages(None, half_life=100)
    for _ in range(1000):
        hot.record("one-callers-favourite")  # a burst long ago
    assert hot.top(1) == ["one-callers-favourite"]
    for _ in range(60):  # six half-lives of what is asked now, steadily
        for chunk_id in ("a", "b", "c"):
            hot.record(chunk_id)
        for i in range(7):
            hot.record(f"rare-{i}")
    assert set(hot.top(3)) == {"a", "b", "c"}


def test_a_read_only_place_is_reported_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    hot = HotPassages(tmp_path / "missing-folder" / "hot.json")
    hot.record("a")
    with caplog.at_level(logging.WARNING):
        hot.save()
        hot.record("b")
        hot.save()
    assert caplog.text.count("cannot save retrieval counts") == 1
    assert hot.top(2) == ["a", "b"]  # still counted in memory
    # The place becomes writable (a volume mounted late, space freed): the next save writes.
    (tmp_path / "missing-folder").mkdir()
    hot.save()
    assert json.loads((tmp_path / "missing-folder" / "hot.json").read_text())["counts"] == {"a": 1, "b": 1}


def test_tracking_is_bounded(tmp_path: Path) -> None:
    hot = HotPassages(None, max_tracked=10)
    for i in range(10):
        for _ in range(i + 1):
            hot.record(f"c{i}")
    hot.record("new")
    assert len(hot.top(100)) == 5 and hot.top(1) == ["c9"]


class FakeRecordingGenerator(FakeGenerator):
    """Records the prompts and params of every stream (warming calls included)."""

    def __init__(self) -> None:
        super().__init__(words=["ok"], usage=Usage(10, 1, 0))
        self.params: list[GenerateParams] = []

    async def stream(self, prompt: Prompt, params: GenerateParams, trace_id: str) -> AsyncIterator[GenerationChunk]:
        self.params.append(params)
        async for chunk in super().stream(prompt, params, trace_id):
            yield chunk


@pytest.fixture
def make_pipeline(sample_index: Path, embedder: SentenceTransformerEmbedder):
    executors: list[ThreadPoolExecutor] = []

    def make(generator: FakeGenerator, hot: HotPassages, policy: AnswerPolicy | None = None) -> RagPipeline:
        executors.append(ThreadPoolExecutor(2))  # a closed pipeline shuts its threads down
        index = HnswIndex.load(sample_index)
        return assemble_pipeline(embedder, index, generator, executors[-1], policy=policy, hot=hot)

    yield make
    for executor in executors:
        executor.shutdown()


def test_the_most_retrieved_top_passages_are_prefilled_at_start(make_pipeline, tmp_path: Path) -> None:
    path = tmp_path / "hot.json"
    questions = [
        "Who discovered penicillin?",
        "In which year was penicillin discovered, and by whom?",
        "How does a Bloom filter work?",
    ]

    async def ask(pipeline, question: str) -> str:  # type: ignore[no-untyped-def]
        params, gen = RetrieveParams(question, 3, 10_000), GenerateParams(8, 0.0)
        events = [e async for e in pipeline.query(params, gen, RequestContext(Deadline(10_000), "r"))]
        return str(events[0].passages[0].chunk.chunk_id)

    async def serve_then_restart() -> tuple[FakeGenerator, FakeRecordingGenerator]:
        cold = FakeGenerator()
        async with make_pipeline(cold, HotPassages(path)) as first:
            tops = [await ask(first, q) for q in questions]
        assert json.loads(path.read_text())["counts"][tops[0]] == 2  # saved at shutdown
        generator = FakeRecordingGenerator()
        async with make_pipeline(generator, HotPassages(path)) as second:
            # Nothing pre-filled before SERVING: the server starts warming after it.
            assert not [params for params in generator.params if params.max_tokens == 1]
            await second.warm_hot_passages()
            await ask(second, questions[0])
        return cold, generator

    cold, generator = asyncio.run(serve_then_restart())
    # A warm top passage may be padded to a KV block (generate/rendering.py); a cold one never is.
    assert not any(p.warmed for p in cold.prompts)
    with_passages = [p for p in generator.prompts if "<passage " in p.user]
    assert all(p.warmed for p in with_passages) and with_passages[-1].user.endswith(f"Question: {questions[0]}")
    warm = [p for p, params in zip(generator.prompts, generator.params, strict=True) if params.max_tokens == 1]
    # The two distinct top passages, the most retrieved first, then the rest of the corpus.
    assert "Discovery of Penicillin" in warm[0].user and "Bloom" in warm[1].user
    assert len(warm) > 2 and len({p.user for p in warm}) == len(warm)
    # Rendered as a Query renders its top passage, with nothing of any question before it.
    assert warm[0].user.startswith('<passages>\n<passage id="1" title="The Discovery of Penicillin">')


def test_warming_stays_within_its_share_of_the_kv_cache(make_pipeline) -> None:
    async def warm(kv_tokens: int | None, policy: AnswerPolicy) -> int:
        generator = FakeRecordingGenerator()
        hot = HotPassages(None)
        pipeline = make_pipeline(generator, hot, policy)
        index = pipeline.index
        assert isinstance(index, HnswIndex)
        chunks = index.chunks[:8]
        for chunk in chunks:
            hot.record(chunk.chunk_id)
        # The fake counts words; each warmed passage is charged what its prompt adds to the template's.
        alone = build_prompt("", [Passage(chunks[0], 1.0, 1)], "reusable", warmed=True)
        first = generator.prompt_tokens(alone) - generator.prompt_tokens(build_prompt("", [], "reusable"))
        assert first > generator.count_tokens(chunks[0].text) + generator.count_tokens(chunks[0].title)  # markup
        generator.kv_tokens = 4 * first if kv_tokens is None else kv_tokens
        return await pipeline.warm_hot_passages()

    hot_only = AnswerPolicy(warm_whole_corpus=False, warm_kv_share=0.25)
    assert asyncio.run(warm(10_000_000, hot_only)) == 8
    assert asyncio.run(warm(None, hot_only)) == 1  # share 0.25: room for one
    assert asyncio.run(warm(0, AnswerPolicy())) == 0
    assert asyncio.run(warm(10_000_000, AnswerPolicy(warm_passages=0))) == 0
    # Only the reusable layout renders a passage the same for every question.
    assert asyncio.run(warm(10_000_000, AnswerPolicy(prompt_layout="stable"))) == 0


def test_without_history_the_whole_corpus_is_warmed_in_the_index_order_as_far_as_the_share_goes(
    make_pipeline,
) -> None:
    async def warm(kv_tokens: int) -> tuple[list[Prompt], WarmState, int, list[str]]:
        generator = FakeRecordingGenerator()
        generator.kv_tokens = kv_tokens
        pipeline = make_pipeline(generator, HotPassages(None))
        index = pipeline.index
        assert isinstance(index, HnswIndex)
        await pipeline.warm_hot_passages()
        return generator.prompts, pipeline.warm_state(), index.count, [c.text for c in index.chunks]

    prompts, state, count, texts = asyncio.run(warm(10_000_000))
    assert state.done and state.passages == len(prompts) and state.left_out == count - state.passages
    assert state.passages > 0.8 * count  # all but passages too long to be reused whole
    assert texts[0].strip() in prompts[0].user  # the index's own order
    assert state.tokens > 0
    # Warming off: done at once, everything cold (what Info and the benchmarks wait for).
    off = make_pipeline(FakeRecordingGenerator(), HotPassages(None), AnswerPolicy(warm_passages=0))
    asyncio.run(off.warm_hot_passages())
    assert off.warm_state().done and off.warm_state().left_out == count
    # A corpus that does not fit: the first passages that fit, the rest reported as left cold.
    prompts, state, count, _ = asyncio.run(warm(4 * 200))
    assert 0 < state.passages < 10 and state.left_out == count - state.passages


def test_warming_pauses_while_an_interactive_query_runs_and_counts_warm_top_passages(make_pipeline) -> None:
    async def run() -> tuple[int, int, WarmState]:
        generator = FakeRecordingGenerator()
        pipeline = make_pipeline(generator, HotPassages(None))
        question = RetrieveParams("Who discovered penicillin?", 3, 10_000)
        before = _warm_hits()
        # A Query starts and holds its stream open: warming must not pre-fill anything meanwhile.
        stream = pipeline.query(question, GenerateParams(8, 0.0), RequestContext(Deadline(10_000), "r"))
        await anext(stream)
        warming = asyncio.create_task(pipeline.warm_hot_passages())
        await asyncio.sleep(0.5)
        prefilled_while_busy = sum(1 for p in generator.params if p.max_tokens == 1)
        await stream.aclose()
        await warming
        # Once warm, the same question's top passage is found warm.
        async for _ in pipeline.query(question, GenerateParams(8, 0.0), RequestContext(Deadline(10_000), "r")):
            pass
        return prefilled_while_busy, _warm_hits() - before, pipeline.warm_state()

    prefilled_while_busy, warm_hits, state = asyncio.run(run())
    assert prefilled_while_busy == 0
    assert state.done and state.passages > 0
    assert warm_hits == 1  # the first Query found it cold (not counted here), the second warm


def _warm_hits() -> float:
    return REGISTRY.get_sample_value("ragserve_query_top_passage_warm_total", {"warm": "yes"}) or 0.0


@pytest.mark.slow  # builds two index versions
def test_a_hot_reload_prefills_the_new_versions_most_retrieved_passages(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    docs = write_docs(tmp_path / "docs")
    root = tmp_path / "idx"
    build_index(docs, root, embedder, progress=False)
    generator = FakeRecordingGenerator()
    hot = HotPassages(None)

    async def reload_once() -> tuple[str, list[Prompt]]:
        with ThreadPoolExecutor(2) as executor:
            pipeline = assemble_pipeline(embedder, HnswIndex.load(root), generator, executor, hot=hot)
            async with pipeline:
                index = pipeline.index
                assert isinstance(index, HnswIndex)
                hot_chunk = index.chunks[0]
                hot.record(hot_chunk.chunk_id)  # counted while version 1 served
                warmed_before = len(generator.prompts)
                swapped = asyncio.Event()

                async def warm_after_swap() -> None:
                    await pipeline.warm_hot_passages()
                    swapped.set()

                reloader = IndexReloader(FolderWatch(root), pipeline, interval_s=0.05, after_swap=warm_after_swap)
                (docs / "new.txt").write_text("New\nA brand new document about volcanoes.")
                await asyncio.to_thread(build_index, docs, root, embedder, progress=False)
                task = asyncio.create_task(reloader.run())
                try:
                    await asyncio.wait_for(swapped.wait(), 30)
                finally:
                    task.cancel()
                assert pipeline.index.version == "2" and reloader.reloads == 1
                return hot_chunk.text.strip(), generator.prompts[warmed_before:]

    hot_text, warm = asyncio.run(reload_once())
    # The count outlives the version: an unchanged document keeps its chunk id, and the new
    # version's copy of it is what was pre-filled, rendered as a Query renders a top passage.
    assert warm and warm[0].user.startswith('<passages>\n<passage id="1"')  # the most retrieved first
    assert hot_text in warm[0].user
    assert all(params.max_tokens == 1 for params in generator.params[-len(warm) :])
