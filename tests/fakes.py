"""Fakes shared by the unit tests (named as fakes: the end-to-end tests run the real engine).

One module for them all: generators, a clock, a cross-encoder, an embedder, a flaky cache store,
a gRPC servicer, a served index and vLLM's synchronous engine, each implementing the contract the
product code defines (Generator, a `() -> float` clock, CrossEncoder, Embedder, CacheStore, the
RagService of the .proto, ServedIndex, vLLM's LLMEngine as the engine thread drives it).
Tests tune them with arguments instead of copying them.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import grpc
import numpy as np

from ragserve.cache.base import CacheBackendError
from ragserve.embed.base import QueryEmbedding
from ragserve.events import GenerationChunk, Usage
from ragserve.index.base import SearchIndex
from ragserve.prompt import Prompt
from ragserve.read.base import ReadSpan
from ragserve.read.cost import ReadCost
from ragserve.reports import EngineChoice, GeneratorStatus
from ragserve.rerank.base import EncodedPair
from ragserve.rerank.cost import CostModel
from ragserve.types import WARMING_ENGINE_PRIORITY, GenerateParams
from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc as pb_grpc

# --- Generators ---------------------------------------------------------------------------------


class FakeGeneratorBase:
    """The Generator contract with nothing behind it; subclasses script `stream`.

    Tokens are counted as whitespace-separated words."""

    model_id = "fake-generator"
    answer_identity = "fake-generator@fake"
    engine_choices: tuple[EngineChoice, ...] = ()
    host_cpu = "fake CPU"
    kv_tokens = 100_000

    async def start(self) -> None:
        return None

    def stream(self, prompt: Prompt, params: GenerateParams, trace_id: str) -> AsyncIterator[GenerationChunk]:
        raise NotImplementedError

    def status(self) -> GeneratorStatus:
        return GeneratorStatus(on_this_host=True)

    async def prefill(self, prompt: Prompt) -> None:
        params = GenerateParams(max_tokens=1, temperature=0.0, priority=WARMING_ENGINE_PRIORITY)
        async for _ in self.stream(prompt, params, "prefill"):
            pass

    async def check_health(self) -> None:
        return None

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def prompt_tokens(self, prompt: Prompt) -> int:
        return len(f"{prompt.system} {prompt.user}".split())

    def unfinished_requests(self) -> int:
        return 0

    async def kv_cache_tokens(self) -> int:
        return self.kv_tokens

    async def close(self) -> None:
        return None


DEFAULT_WORDS = ("The ", "answer ", "is ", "[1].")


class FakeGenerator(FakeGeneratorBase):
    """Streams fixed `words`, sleeping `delay_s` before each, and finishes with `finish_reason`.

    The last chunk carries `usage` (by default 100 prompt tokens, one completion token a word and
    64 prefix-cache hits). `fail_after` raises after that many words (an engine failure).
    It records every prompt, counts the streams opened (`calls`), those cancelled while waiting
    (`cancelled`) and the chunks handed out (`produced`)."""

    def __init__(
        self,
        words: Sequence[str] = DEFAULT_WORDS,
        delay_s: float = 0.0,
        finish_reason: str = "stop",
        fail_after: int | None = None,
        usage: Usage | None = None,
    ) -> None:
        self.words = list(words)
        self.delay_s = delay_s
        self.finish_reason = finish_reason
        self.fail_after = fail_after
        self.usage = usage if usage is not None else Usage(100, len(self.words), 64)
        self.prompts: list[Prompt] = []
        self.calls = 0
        self.cancelled = 0
        self.produced = 0

    async def stream(self, prompt: Prompt, params: GenerateParams, trace_id: str) -> AsyncIterator[GenerationChunk]:
        self.prompts.append(prompt)
        self.calls += 1
        for i, word in enumerate(self.words):
            if self.fail_after is not None and i == self.fail_after:
                raise RuntimeError("fake engine failure")
            try:
                await asyncio.sleep(self.delay_s)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            last = i == len(self.words) - 1
            self.produced += 1
            yield GenerationChunk(word, last, self.finish_reason if last else "", self.usage if last else None)


class FakeEndlessGenerator(FakeGeneratorBase):
    """Streams `piece` forever (an engine that never finishes); counts streams opened and closed.

    A stream closed early is the server aborting the engine request."""

    def __init__(self, piece: str = "word ", delay_s: float = 0.0) -> None:
        self.piece = piece
        self.delay_s = delay_s
        self.opened = 0
        self.closed = 0

    async def stream(self, prompt: Prompt, params: GenerateParams, trace_id: str) -> AsyncIterator[GenerationChunk]:
        self.opened += 1
        try:
            while True:
                await asyncio.sleep(self.delay_s)
                yield GenerationChunk(self.piece, False, "", None)
        finally:
            self.closed += 1


class FakeThreadRecordingGenerator(FakeGenerator):
    """Records the thread of every token count (to tell work on the event loop from work off it)."""

    def __init__(self) -> None:
        super().__init__()
        self.counted_on: list[int] = []

    def count_tokens(self, text: str) -> int:
        self.counted_on.append(threading.get_ident())
        return len(text.split())


class FakeHangingHealthGenerator(FakeGeneratorBase):
    """Its health probe never returns (an engine stuck inside a call)."""

    async def check_health(self) -> None:
        await asyncio.Event().wait()


# --- Clock --------------------------------------------------------------------------------------


class FakeClock:
    """A monotonic clock that moves only when told: pass it where the code takes `clock=`."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# --- Cross-encoder ------------------------------------------------------------------------------


class FakeCrossEncoder:
    """Scores a pair by how often the passage says "relevant" (no model weights).

    Optionally sleeps `sleep_ms` per batch, or, given a `clock` and a `cost` model, advances that
    clock by exactly what the cost model predicts for the batch (simulated time)."""

    backend = "fake"
    random_head = False

    def __init__(
        self, name: str = "fake", sleep_ms: float = 0.0, clock: FakeClock | None = None, cost: CostModel | None = None
    ) -> None:
        self.model_id = name
        self.sleep_ms = sleep_ms
        self.clock = clock
        self.cost = cost
        self.batches: list[list[int]] = []  # pair lengths seen per batch

    def encode(self, query: str, texts: Sequence[str]) -> list[EncodedPair]:
        out = []
        for text in texts:
            ids = tuple(1 if w == "relevant" else 2 for w in text.split())
            out.append(EncodedPair(ids, (0,) * len(ids)))
        return out

    def score(self, pairs: Sequence[EncodedPair]) -> np.ndarray:
        if self.clock is not None and self.cost is not None:
            tokens = len(pairs) * max(len(p) for p in pairs)
            self.clock.advance(CostModel(self.cost.ms_per_token, self.cost.overhead_ms).predict(tokens) / 1000.0)
        self.batches.append([len(p) for p in pairs])
        if self.sleep_ms:
            time.sleep(self.sleep_ms / 1000.0)
        return np.array([p.input_ids.count(1) for p in pairs], dtype=np.float32)


# --- Embedder -----------------------------------------------------------------------------------


def unit_vectors(count: int, seed: int, dim: int) -> np.ndarray:
    """`count` random float32 unit vectors of `dim` dimensions, the same for the same seed."""
    vectors = np.random.default_rng(seed).standard_normal((count, dim)).astype(np.float32)
    unit: np.ndarray = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return unit


class FakeEmbedder:
    """The Embedder contract without a model: deterministic unit vectors from a hash of the text.

    `constant=True` gives every text the same vector (for tests where the embedder is not the
    subject). Every query fits the window."""

    model_id = "fake-embedder"

    def __init__(self, dim: int = 8, constant: bool = False) -> None:
        self.dim = dim
        self.constant = constant

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        if self.constant:
            return np.full((len(texts), self.dim), 1.0 / np.sqrt(self.dim), dtype=np.float32)
        seeds = [int.from_bytes(hashlib.sha256(t.encode()).digest()[:4], "little") for t in texts]
        return np.stack([unit_vectors(1, seed, self.dim)[0] for seed in seeds])

    def embed_documents(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        return self.embed_queries(texts)

    def embed_query(self, text: str) -> QueryEmbedding:
        return QueryEmbedding(self.embed_queries([text])[0], fits_window=True)


# --- Cache store --------------------------------------------------------------------------------


class FakeFlakyStore:
    """A store that fails every call while `down` is set, like a Redis that is gone."""

    name = "fake"

    def __init__(self) -> None:
        self.down = False
        self.data: dict[str, bytes] = {}
        self.calls = 0

    def _check(self) -> None:
        self.calls += 1
        if self.down:
            raise CacheBackendError("connection", "refused")

    async def get(self, key: str) -> bytes | None:
        self._check()
        return self.data.get(key)

    async def set(self, key: str, value: bytes, ttl_s: float) -> None:
        self._check()
        self.data[key] = value

    async def ping(self) -> None:
        self._check()

    async def connect(self) -> None:
        self._check()

    async def flush(self) -> int:
        self._check()
        n = len(self.data)
        self.data.clear()
        return n

    async def close(self) -> None:
        return None


# --- gRPC service -------------------------------------------------------------------------------


class FakeRagService(pb_grpc.RagServiceServicer):  # type: ignore[misc]
    """A RagService servicer for client tests: fails the first `failures` calls with UNAVAILABLE,
    then answers. Retrieve returns one passage whose text is the query; Query streams three words,
    sleeping `delay_s` before Retrieve's answer and before each word."""

    def __init__(self, failures: int = 0, delay_s: float = 0.0) -> None:
        self.failures = failures
        self.delay_s = delay_s
        self.attempts = 0

    async def Retrieve(self, request: pb.RetrieveRequest, context: grpc.aio.ServicerContext) -> pb.RetrieveResponse:
        self.attempts += 1
        if self.attempts <= self.failures:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "restarting")
        await asyncio.sleep(self.delay_s)
        return pb.RetrieveResponse(passages=[pb.Passage(doc_id="d", chunk_id="d#0", text=request.query, score=1.0)])

    async def Query(self, request: pb.QueryRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.QueryEvent]:
        yield pb.QueryEvent(retrieval=pb.RetrievalEvent(passages=[pb.Passage(doc_id="d")]))
        for word in ("a", "b", "c"):
            await asyncio.sleep(self.delay_s)
            yield pb.QueryEvent(token=pb.TokenEvent(text=word))
        yield pb.QueryEvent(final=pb.FinalEvent(finish_reason="stop"))


# --- Hot reload ---------------------------------------------------------------------------------


class FakeServing:
    """Serves one index and takes a new one, as the pipeline does for the hot reloader (ServedIndex)."""

    def __init__(self, index: SearchIndex) -> None:
        self.index = index
        self.refusals: list[str] = []

    def swap_index(self, index: SearchIndex) -> None:
        self.index = index

    def refused(self, reason: str) -> None:
        self.refusals.append(reason)


# --- vLLM's synchronous engine (the engine-on-a-thread layout) --------------------------------


@dataclass
class FakeOutput:
    request_id: str
    text: str
    finished: bool


@dataclass
class FakeSyncEngine:
    """Each step gives every running request `per_step` more words of its prompt, echoed back."""

    per_step: int = 1
    fail_on_step: int = 0  # raise on this step (1-based); 0: never
    steps: int = 0
    running: dict[str, tuple[list[str], int]] = field(default_factory=dict)
    aborted: list[str] = field(default_factory=list)
    threads: set[str] = field(default_factory=set)
    core_shut_down: bool = False
    priorities: dict[str, int] = field(default_factory=dict)

    @property
    def engine_core(self) -> FakeSyncEngine:
        return self

    def shutdown(self) -> None:
        self.core_shut_down = True

    def add_request(self, request_id: str, prompt: str, sampling: object, priority: int = 0) -> None:
        self.threads.add(threading.current_thread().name)
        self.priorities[request_id] = priority
        if prompt == "too long":
            raise ValueError("prompt is longer than the model's context")
        self.running[request_id] = (prompt.split(), 0)

    def abort_request(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.running.pop(request_id, None)
            self.aborted.append(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def get_num_unfinished_requests(self) -> int:
        return len(self.running)

    def step(self) -> list[FakeOutput]:
        self.threads.add(threading.current_thread().name)
        self.steps += 1
        if self.steps == self.fail_on_step:
            raise RuntimeError("engine step failed")
        outputs = []
        for request_id, (words, done) in list(self.running.items()):
            done = min(len(words), done + self.per_step)
            finished = done == len(words)
            outputs.append(FakeOutput(request_id, " ".join(words[:done]), finished))
            if finished:
                del self.running[request_id]
            else:
                self.running[request_id] = (words, done)
        return outputs


class FakeReader:
    """The Reader contract with a keyword match behind it: the span is `answer` wherever a passage
    holds it, with `margin` over no-answer; no passage holds it: a one-word span at `margin_absent`.
    `delay_s`: the time each read takes (on the model threads). Counts its reads."""

    model_id = "fake-reader"
    no_answer_threshold = 0.0

    def __init__(self, answer: str, margin: float = 3.0, margin_absent: float = -3.0, delay_s: float = 0.0) -> None:
        self.answer = answer
        self.margin = margin
        self.margin_absent = margin_absent
        self.delay_s = delay_s
        self.cost = ReadCost(1.0)
        self.reads: list[tuple[str, int]] = []

    def read(self, question: str, passages: Sequence[str]) -> list[ReadSpan]:
        time.sleep(self.delay_s)
        self.reads.append((question, len(passages)))
        spans = []
        for i, text in enumerate(passages):
            at = text.find(self.answer)
            if at >= 0:
                spans.append(ReadSpan(i, at, at + len(self.answer), self.answer, self.margin, 0.0))
            else:
                word = text.split()[0] if text.split() else ""
                spans.append(ReadSpan(i, 0, len(word), word, self.margin_absent, 0.0))
        return spans
