"""Warming under faults and beside traffic: a failed or stalled prefill costs its passage only and
warming always ends done; a new trigger replaces the run in progress; warming goes after every
Query's work (the engine's priority, else pacing beside batch Queries). The generators are fakes,
named as such; the index and embedder are real."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ragserve.budget import Deadline, RequestContext
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.errors import Overloaded, Unavailable
from ragserve.events import GenerationChunk, Usage
from ragserve.factory import assemble_pipeline
from ragserve.index.hnsw import HnswIndex
from ragserve.prompt import Prompt
from ragserve.reports import GeneratorStatus, WarmState
from ragserve.request import warming
from ragserve.request.hot import HotPassages
from ragserve.request.pipeline import RagPipeline
from ragserve.types import GenerateParams, RequestClass, RetrieveParams
from tests.fakes import FakeGenerator


class FakeFaultyPrefillGenerator(FakeGenerator):
    """Answers Queries at once; its prefills fail as scripted: `faults[i]` is raised by the i-th
    prefill (None: it succeeds), `hang_s` stalls every prefill, `prefill_s` is what a good one takes.
    Records when each prefill started and ended."""

    def __init__(self, faults: list[Exception | None] | None = None, prefill_s: float = 0.0) -> None:
        super().__init__(words=["ok"], usage=Usage(10, 1, 0))
        self.faults = faults or []
        self.prefill_s = prefill_s
        self.hang_s = 0.0
        self.by_priority = False
        self.prefills: list[tuple[float, float]] = []
        self.prefill_params: list[GenerateParams] = []

    def status(self) -> GeneratorStatus:
        return GeneratorStatus(on_this_host=True, by_priority=self.by_priority)

    async def stream(self, prompt: Prompt, params: GenerateParams, trace_id: str) -> AsyncIterator[GenerationChunk]:
        if trace_id != "prefill":
            async for chunk in super().stream(prompt, params, trace_id):
                yield chunk
            return
        started = time.monotonic()
        at = len(self.prefills)
        self.prefills.append((started, started))
        self.prefill_params.append(params)
        await asyncio.sleep(self.hang_s or self.prefill_s)
        fault = self.faults[at] if at < len(self.faults) else None
        if fault is not None:
            raise fault
        self.prefills[at] = (started, time.monotonic())
        yield GenerationChunk("x", True, "length", Usage(10, 1, 0))


@pytest.fixture
def make_pipeline(sample_index: Path, embedder: SentenceTransformerEmbedder):
    executors: list[ThreadPoolExecutor] = []

    def make(generator: FakeGenerator | None) -> RagPipeline:
        executors.append(ThreadPoolExecutor(2))
        index = HnswIndex.load(sample_index)
        return assemble_pipeline(embedder, index, generator, executors[-1], hot=HotPassages(None))

    yield make
    for executor in executors:
        executor.shutdown()


@pytest.fixture
def quick_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warming, "FAILURE_WAIT_S", 0.01)


async def _until(condition: Callable[[], bool], limit_s: float = 30.0) -> None:
    for _ in range(int(limit_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not reached within {limit_s:g} s")


def _warm(pipeline: RagPipeline) -> tuple[int, WarmState]:
    async def run() -> int:
        return await asyncio.wait_for(pipeline.warm_hot_passages(), 60)

    return asyncio.run(run()), pipeline.warm_state()


def test_a_failed_prefill_costs_its_passage_and_warming_still_ends_done(make_pipeline, quick_failures) -> None:
    faults: list[Exception | None] = [None, RuntimeError("the engine rejected the prompt"), Overloaded("busy", 20)]
    generator = FakeFaultyPrefillGenerator(faults)
    pipeline = make_pipeline(generator)
    warmed, state = _warm(pipeline)
    assert state.done and warmed == state.passages == len(generator.prefills) - 2
    assert state.passages > 1  # it went on after the failures
    # The two failed passages are counted with the rest that stayed cold.
    assert state.passages + state.left_out == pipeline.index.count


def test_with_no_server_up_warming_stops_soon_and_ends_done(make_pipeline, quick_failures) -> None:
    generator = FakeFaultyPrefillGenerator([Unavailable("no generation server is up")] * 1000)
    pipeline = make_pipeline(generator)
    warmed, state = _warm(pipeline)
    assert state.done and warmed == 0 and state.left_out == pipeline.index.count
    assert len(generator.prefills) == warming.GIVE_UP_AFTER_FAILURES


def test_an_engine_that_cannot_say_its_cache_size_leaves_everything_cold_and_done(make_pipeline) -> None:
    class FakeSilentCacheGenerator(FakeFaultyPrefillGenerator):
        async def kv_cache_tokens(self) -> int:
            raise Unavailable("no generation server is up")

    generator = FakeSilentCacheGenerator()
    pipeline = make_pipeline(generator)
    warmed, state = _warm(pipeline)
    assert state.done and warmed == 0 and state.left_out == pipeline.index.count and not generator.prefills


def test_a_stalled_prefill_is_bounded(make_pipeline, quick_failures, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warming, "PREFILL_LIMIT_S", 0.05)
    generator = FakeFaultyPrefillGenerator()
    generator.hang_s = 3600.0
    pipeline = make_pipeline(generator)
    warmed, state = _warm(pipeline)
    assert state.done and warmed == 0 and len(generator.prefills) == warming.GIVE_UP_AFTER_FAILURES


def test_a_new_trigger_replaces_the_warming_in_progress(make_pipeline) -> None:
    generator = FakeFaultyPrefillGenerator(prefill_s=0.05)
    pipeline = make_pipeline(generator)

    async def run() -> tuple[int, bool, WarmState]:
        first = asyncio.create_task(pipeline.warm_hot_passages())
        await _until(lambda: len(generator.prefills) >= 2)
        second = asyncio.create_task(pipeline.warm_hot_passages())
        generator.prefill_s = 0.0  # the new run need not be slow
        replaced = await asyncio.wait_for(first, 5)  # not held until the old run is over
        second_still_running = not second.done()
        await asyncio.wait_for(second, 60)
        return replaced, second_still_running, pipeline.warm_state()

    replaced, second_still_running, state = asyncio.run(run())
    assert replaced == 0 and second_still_running
    assert state.done and state.passages > 0


def test_a_server_without_a_generator_reports_warming_done(make_pipeline) -> None:
    state = make_pipeline(None).warm_state()
    assert state.done and state.passages == 0


def test_warming_prefills_go_after_batch_work_in_the_engines_queue(make_pipeline) -> None:
    generator = FakeFaultyPrefillGenerator()
    _warm(make_pipeline(generator))
    assert generator.prefill_params
    assert all(p.priority > RequestClass.BATCH.engine_priority for p in generator.prefill_params)


def test_without_priority_scheduling_warming_paces_itself_beside_batch_queries(make_pipeline) -> None:
    prefill_s = 0.05
    generator = FakeFaultyPrefillGenerator(prefill_s=prefill_s)
    pipeline = make_pipeline(generator)

    async def run() -> None:
        question = RetrieveParams("Who discovered penicillin?", 3, 10_000)
        batch = RequestContext(Deadline(10_000), "b", RequestClass.BATCH)
        generator.delay_s = 5.0  # the batch Query holds its stream open
        stream = pipeline.query(question, GenerateParams(8, 0.0), batch)
        started = asyncio.create_task(anext(stream))
        await _until(lambda: generator.calls > 0)
        warm = asyncio.create_task(pipeline.warm_hot_passages())
        await _until(lambda: len(generator.prefills) >= 4)
        warm.cancel()
        started.cancel()
        await stream.aclose()

    asyncio.run(run())
    starts = [start for start, _ in generator.prefills[:4]]
    # Each prefill is followed by BATCH_PACE times its own length of rest while batch work runs.
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= (1 + warming.BATCH_PACE) * prefill_s * 0.95
