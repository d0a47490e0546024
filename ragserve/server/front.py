"""The front every door calls: gRPC (server/grpc/servicer.py), the OpenAI-compatible HTTP door
(server/openai/door.py) and any door after them. Once, for all of them:

- who the caller is (server/identity.py);
- a call's outcome (`outcome`): whatever the call raises becomes one failure the door sends in its
  own shape (a RagError as it is, a crash as an INTERNAL one whose traceback stays in the log), the
  status metric and the log line;
- admission and the call's clock (`enter`: the call gate, server/gate.py);
- the request values, assembled in one order from a door-neutral `Ask` (`params`);
- what each answer event leaves in the logs and metrics (`observe`).

It imports no gRPC and no Starlette: a door maps its wire to an `Ask` and a `Door`, and an error's
kind to its own status in one table (server/grpc/status.py, server/http/errors.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from ragserve.config import Settings
from ragserve.errors import IndexLoadError, InvalidArgument, RagError, Unavailable
from ragserve.events import FinalSummary, QueryEvent
from ragserve.filters import FieldSchema
from ragserve.reports import PipelineInfo, WarmState
from ragserve.request.pipeline import RagPipeline
from ragserve.request.readable import readable_chunks
from ragserve.request.source_view import SourceView, neighbourhood, source_view
from ragserve.server.gate import Call, CallGate, Door
from ragserve.server.identity import Identity
from ragserve.server.observability import observe_final, observe_request, observe_retrieval
from ragserve.server.validation import Narrowing, validate_generate, validate_history, validate_retrieve, with_history
from ragserve.types import Chunk, GenerateParams, RetrievalResult, RetrieveParams

log = logging.getLogger(__name__)

# The longest chunk or document id a fetch takes (ids are a file's path and a chunk number).
MAX_ID_CHARS = 1024

# What a door does with a call's failure: send it in its own shape (a status, an error body).
Fail = Callable[[RagError], Awaitable[None]]


class Internal(RagError):
    """A bug, not the caller's mistake: the caller is told only the request id."""


@dataclass(frozen=True)
class Ask:
    """A request as every door hands it to the front. Where a door's wire holds the question and
    the turns somewhere else than gRPC's `query` and `history`, `question_field`, `turns_field` and
    `turn_positions` name them, so an error names the caller's own field."""

    question: str
    top_k: int = 0
    budget_ms: int = 0
    dedupe_documents: bool = False
    filter: object = None  # the filter as JSON values (Qdrant's shape), None: none
    max_tokens: int = 0
    temperature: float = 0.0
    context_token_budget: int | None = None
    turns: tuple[tuple[str, str], ...] = ()
    question_field: str = "query"
    turns_field: str = "history"
    turn_positions: tuple[int, ...] = ()


class Front:
    """`pipeline` is None until loading finishes: every call is UNAVAILABLE until then."""

    def __init__(self, settings: Settings, gate: CallGate) -> None:
        self.pipeline: RagPipeline | None = None
        self.gate = gate
        self.identity = Identity(settings.access)
        self.retrieval_budget_ms = settings.requests.retrieval_budget_ms
        self._settings = settings
        self._narrowing = Narrowing(settings)

    def ready(self) -> RagPipeline:
        if self.pipeline is None:
            raise Unavailable("server is still loading the index and models")
        return self.pipeline

    @contextlib.asynccontextmanager
    async def outcome(
        self, method: str, request_id: str, fail: Fail, passthrough: tuple[type[BaseException], ...] = ()
    ) -> AsyncIterator[float]:
        """A call from arrival (the time.monotonic reading it yields: `enter` counts from it) to its
        status. A cancelled call (the client gone) ends in CancelledError, a BaseException: it passes
        through untouched and is counted as CANCELLED. `passthrough`: a door's own exceptions that
        already sent their status (counted UNKNOWN)."""
        arrived = time.monotonic()
        code = "CANCELLED"
        try:
            yield arrived
            code = "OK"
        except passthrough:
            code = "UNKNOWN"
            raise
        except IndexLoadError as error:
            # Its text names the server's files: the log keeps it, the caller gets the request id.
            code = error.kind.value
            log.error("request failed: %s", error, extra={"request_id": request_id, "method": method, "code": code})
            await fail(Unavailable(f"the index could not be read (request id {request_id})"))
        except RagError as error:
            code = error.kind.value
            extra = {"request_id": request_id, "method": method, "code": code, "error": type(error).__name__}
            log.info("request failed", extra=extra)
            await fail(error)
        except Exception:
            code = "INTERNAL"
            log.exception("request crashed", extra={"request_id": request_id, "method": method})
            await fail(Internal(f"internal error (request id {request_id})"))
        finally:
            observe_request(method, code, (time.monotonic() - arrived) * 1000.0)

    def enter(
        self, method: str, door: Door, arrived: float, slot: bool = True
    ) -> contextlib.AbstractAsyncContextManager[Call]:
        """Admission (a slot unless `slot` is false), the span and the call's one clock, from `arrived`."""
        return self.gate.enter(method, door, slot, arrived)

    def retrieve_params(self, ask: Ask, names: set[str]) -> RetrieveParams:
        settings = self._settings
        try:
            params = validate_retrieve(settings, ask.question, ask.top_k, ask.budget_ms, ask.dedupe_documents)
        except InvalidArgument as error:
            if error.field != "query" or ask.question_field == "query":
                raise
            raise InvalidArgument(ask.question_field, error.description) from None
        return self._narrowing.apply(params, ask.filter, self.ready().serving.index.fields, names)

    def params(self, ask: Ask, names: set[str]) -> tuple[RetrieveParams, GenerateParams]:
        """One order on every door: the question and retrieval fields, the filter and the caller's
        grant, the generation fields, then the history."""
        settings = self._settings
        params = self.retrieve_params(ask, names)
        gen = validate_generate(settings, ask.max_tokens, ask.temperature, ask.context_token_budget)
        turns = validate_history(settings, ask.turns, ask.turns_field, ask.turn_positions)
        return with_history(settings.history, params, gen, turns)

    async def retrieve(self, call: Call, ask: Ask, names: set[str], answer_span: bool = False) -> RetrievalResult:
        params = self.retrieve_params(ask, names)
        result = await self.ready().retrieve(params, call.request(params.budget_ms), answer_span)
        self.observe(call, result)
        return result

    async def query(self, call: Call, ask: Ask, names: set[str]) -> AsyncGenerator[QueryEvent, None]:
        """The answer's events, each observed. A door closes this stream when it stops reading
        (contextlib.aclosing): closing it closes the pipeline's, which aborts the engine request."""
        params, gen = self.params(ask, names)
        events = self.ready().query(params, gen, call.request(params.budget_ms))
        async with contextlib.aclosing(events):
            async for event in events:
                self.observe(call, event)
                yield event

    async def info(self, names: set[str]) -> tuple[PipelineInfo, int]:
        """What this caller's grant sees of the index, and the calls in flight besides this one
        (which holds a slot: its count may be a round trip to the index, request/readable.py).
        Warming's passage counts are of the whole corpus: a caller whose grant reads less gets
        only whether warming is done."""
        grant = self._narrowing.access.grant_for(names)
        info = await self.ready().info_for(grant)
        if grant is not None:
            warmed = info.warming
            info = dataclasses.replace(info, warming=WarmState(warmed.version, done=warmed.done))
        return info, max(0, self.gate.in_flight - 1)

    async def fetch(self, chunk_id: str, doc_id: str, names: set[str]) -> tuple[list[Chunk], str]:
        """The chunk, or the document's chunks, this caller's grant may read, and the index version
        (an ungranted id and an unknown one alike: nothing)."""
        if bool(chunk_id) == bool(doc_id):
            raise InvalidArgument("chunk_id", "give exactly one of chunk_id and doc_id")
        for name, value in (("chunk_id", chunk_id), ("doc_id", doc_id)):
            if len(value) > MAX_ID_CHARS or "\x00" in value:
                raise InvalidArgument(name, f"must be at most {MAX_ID_CHARS} characters, without NUL")
        index = self.ready().index
        grant = self._narrowing.access.grant_for(names)
        return await asyncio.to_thread(readable_chunks, index, chunk_id, doc_id, grant), index.version

    async def source(
        self, chunk_id: str, start: int | None, end: int | None, context_chars: int, names: set[str]
    ) -> tuple[SourceView | None, str]:
        """The document text around a quote of `chunk_id` (a citation's quote_start/quote_end),
        within this caller's grant, and the index version; None for an ungranted or unknown chunk."""
        if not chunk_id or len(chunk_id) > MAX_ID_CHARS or "\x00" in chunk_id:
            raise InvalidArgument("chunk_id", f"must be 1..{MAX_ID_CHARS} characters, without NUL")
        index = self.ready().index
        grant = self._narrowing.access.grant_for(names)
        chunks = await asyncio.to_thread(neighbourhood, index, chunk_id, grant, context_chars)
        return (source_view(chunks, start, end, context_chars) if chunks else None), index.version

    def fields(self) -> FieldSchema:
        """The filterable fields of the serving version and their types (docs/filters.md)."""
        return self.ready().index.fields

    @staticmethod
    def observe(call: Call, event: QueryEvent) -> None:
        if isinstance(event, RetrievalResult):
            _log_retrieval(call, event)
        elif isinstance(event, FinalSummary):
            _log_answer(call, event)


def _log_retrieval(call: Call, result: RetrievalResult) -> None:
    # Ids and sizes only: document text and the question never reach the logs.
    log.info(
        "retrieved",
        extra={
            "request_id": call.request_id,
            "method": call.method,
            "doc_ids": [p.chunk.doc_id for p in result.passages],
            "passage_chars": [len(p.chunk.text) for p in result.passages],
            "retrieval_ms": round(result.timings.retrieval_total_ms, 2),
            "cache_hit": result.cache_hit,
        },
    )
    observe_retrieval(result)


def _log_answer(call: Call, summary: FinalSummary) -> None:
    log.info(
        "answered",
        extra={
            "request_id": call.request_id,
            "method": call.method,
            "prompt_tokens": summary.usage.prompt_tokens,
            "prefix_cache_hit_tokens": summary.usage.prefix_cache_hit_tokens,
            "completion_tokens": summary.usage.completion_tokens,
            "ttft_ms": round(summary.timings.ttft_ms, 1),
            "finish_reason": summary.finish_reason,
            "answer_cache_hit": summary.answer_cache_hit,
        },
    )
    observe_final(summary)
