"""Pre-filling the engine's prefix cache with the passages questions will reuse.

One entry point for every trigger: start (in the background, once the server is SERVING), a newly
published version, a generation server that comes back with an empty cache. One run at a time: a
new trigger cancels the run in progress (an older version's passages are not worth finishing). The
most retrieved top passages (request/hot.py) go first, then (RAGSERVE_WARM_WHOLE_CORPUS) the rest
of the corpus in the index's order, each rendered exactly as a Query renders its top passage, until
the policy's share of the KV cache is used; what does not fit is counted as left out. Only the
reusable layout renders a passage the same for every question, so only it can reuse them.

Warming yields to every Query: it pauses while an interactive one runs, and its prefills go to the
engine at the lowest priority, after batch work, where the engine schedules by priority; where it
does not, warming paces itself while batch Queries run. A prefill that fails (overload, no server
up, a stall, a prompt the engine rejects) costs its passage only: warming backs off, goes on, and
always ends `done`, saying what stayed cold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field

from ragserve import metrics
from ragserve.errors import Overloaded
from ragserve.generate.base import Generator
from ragserve.prompt import Prompt, build_prompt
from ragserve.reports import WarmState
from ragserve.request.hot import HotPassages
from ragserve.request.model_threads import CURRENT_CLASS, ModelThreads
from ragserve.request.policy import AnswerPolicy
from ragserve.request.serving import ServingVersion
from ragserve.types import Chunk, Passage, RequestClass

log = logging.getLogger(__name__)

# Warming resumes only after this long without interactive Query traffic: a person asking question
# after question never finds a warming prefill in the engine ahead of the next one.
QUIET_S = 0.25
# Where the engine cannot put warming after batch work (no priority scheduling), a prefill of t
# seconds is followed by BATCH_PACE x t of rest while batch Queries run: warming then takes at most
# 1 / (1 + BATCH_PACE) of the engine from them, and still finishes under steady batch load.
BATCH_PACE = 3.0
# After a failed prefill warming waits, doubling from the first wait up to the longest (or what an
# overloaded server asks for); after this many failures in a row it stops, the rest left cold (a
# generation server that comes back is warmed again).
FAILURE_WAIT_S = 0.2
FAILURE_WAIT_MAX_S = 5.0
GIVE_UP_AFTER_FAILURES = 4
# The longest one prefill may take (a stalled engine): past it its passage counts as failed.
PREFILL_LIMIT_S = 60.0
# Corpus passages read (decoded) per call on the model threads: a few milliseconds each.
READ_BATCH = 16


class QueryTraffic:
    """Queries running now (interactive and batch), and when the last interactive one ended."""

    def __init__(self) -> None:
        self._interactive = 0
        self.batch = 0  # batch Queries running now
        self._idle = asyncio.Event()
        self._idle.set()
        self._last_end = 0.0

    @contextlib.contextmanager
    def running(self, interactive: bool) -> Iterator[None]:
        """Around one Query, for as long as it runs."""
        if not interactive:
            self.batch += 1
            try:
                yield
            finally:
                self.batch -= 1
            return
        self._interactive += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._interactive -= 1
            if not self._interactive:
                self._last_end = time.monotonic()
                self._idle.set()

    async def wait_quiet(self, quiet_s: float = QUIET_S) -> None:
        """Until no interactive Query runs and none has ended within `quiet_s`."""
        while True:
            await self._idle.wait()
            left = quiet_s - (time.monotonic() - self._last_end)
            if left <= 0:
                return
            await asyncio.sleep(left)


@dataclass(slots=True)
class _Run:
    """One warming run's tally."""

    room: int  # KV tokens left in warming's share
    warm: set[str] = field(default_factory=set)
    tokens: int = 0
    left_out: int = 0
    failed: int = 0
    failures_in_row: int = 0
    planned: int = 0  # the passages this run tries


class Warmer:
    def __init__(
        self,
        generator: Generator,
        policy: AnswerPolicy,
        hot: HotPassages,
        threads: ModelThreads,
        traffic: QueryTraffic | None = None,
    ) -> None:
        """`traffic`: the Queries warming gives way to, between passages."""
        self._generator = generator
        self._policy = policy
        self._hot = hot
        self._threads = threads
        self._traffic = traffic
        self.state = WarmState()
        self._warm_ids: frozenset[str] = frozenset()
        self._running: asyncio.Task[int] | None = None

    def is_warm(self, chunk_id: str) -> bool:
        return chunk_id in self._warm_ids

    async def warm(self, serving: ServingVersion) -> int:
        """Pre-fill `serving`'s passages, one at a time; how many were warmed (0 when a newer
        trigger replaced this run)."""
        if self._policy.warm_passages <= 0 or self._policy.prompt_layout != "reusable":
            self._publish(WarmState(serving.identity, left_out=serving.index.count, done=True))  # nothing to do
            return 0
        if self._running is not None:
            self._running.cancel()  # the newest trigger's version is the one worth warming
        run = self._running = asyncio.ensure_future(self._warm_as_batch(serving))
        try:
            return await run
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if run is not self._running and task is not None and not task.cancelling():
                return 0  # replaced; this caller itself was not cancelled
            raise

    async def _warm_as_batch(self, serving: ServingVersion) -> int:
        CURRENT_CLASS.set(RequestClass.BATCH)  # its model-thread work queues after people's
        return await self._warm(serving)

    async def _warm(self, serving: ServingVersion) -> int:
        started = time.perf_counter()
        generator, policy = self._generator, self._policy
        self._warm_ids = frozenset()
        self._publish(WarmState(serving.identity))
        hot, corpus = await self._threads.run(lambda: self._candidates(serving))
        planned = min(policy.warm_passages, len(hot) + len(corpus))
        run = _Run(int(policy.warm_kv_share * await self._kv_cache_tokens()), planned=planned)
        self._publish(WarmState(serving.identity, planned=run.planned))
        # Every prompt shares the template's KV: a passage takes what its prompt adds to it.
        template = await self._threads.run(lambda: generator.prompt_tokens(build_prompt("", [], policy.prompt_layout)))
        paced = not generator.status().by_priority
        tried = 0
        async for chunk in self._in_order(hot, corpus, planned):
            if run.failures_in_row >= GIVE_UP_AFTER_FAILURES:
                log.warning(
                    "warming stopped after %d failed prefills in a row; the rest stays cold", run.failures_in_row
                )
                break
            tried += 1
            await self._warm_one(Passage(chunk, 1.0, 1), template, run, serving.identity, paced)
        run.left_out += max(0, serving.index.count - tried)
        seconds = time.perf_counter() - started
        state = WarmState(serving.identity, len(run.warm), run.tokens, run.left_out, True, seconds, run.planned)
        self._publish(state)
        log.info(
            "warming done for index version %s: %d passages (%d tokens) pre-filled in %.1f s; %d left cold "
            "(past RAGSERVE_WARM_KV_SHARE, too long to reuse, or %d failed prefills)",
            serving.version, state.passages, state.tokens, state.seconds, state.left_out, run.failed,
        )  # fmt: skip
        return state.passages

    async def _kv_cache_tokens(self) -> int:
        """The engine's KV cache size; 0 (nothing fits, the run still ends done) when it cannot say."""
        try:
            return await self._generator.kv_cache_tokens()
        except Exception as exc:
            log.warning("warming: the engine's KV cache size is not known (%r); nothing is pre-filled", exc)
            return 0

    async def _warm_one(self, passage: Passage, template: int, run: _Run, identity: str, paced: bool) -> None:
        """One passage: sized, then pre-filled when it fits, once no interactive Query runs."""
        size = await self._threads.run(lambda: self._size(passage, template, run.room))
        if size is None:
            run.left_out += 1  # served cut to the question (never reused), or past the share
            return
        if self._traffic is not None:
            await self._traffic.wait_quiet()
        started = time.perf_counter()
        try:
            async with asyncio.timeout(PREFILL_LIMIT_S):
                # The question comes last: every full KV block before it is this passage's, as served.
                await self._generator.prefill(self._prompt(passage))
        except Exception as exc:  # a cancel is not an Exception: it ends the run
            await self._failed(passage, run, exc)
            return
        run.failures_in_row = 0
        run.room -= size
        run.warm.add(passage.chunk.chunk_id)
        run.tokens += size
        self._warm_ids = frozenset(run.warm)
        self._publish(WarmState(identity, len(run.warm), run.tokens, run.left_out, planned=run.planned))
        if paced and self._traffic is not None and self._traffic.batch:
            await asyncio.sleep(BATCH_PACE * (time.perf_counter() - started))

    async def _failed(self, passage: Passage, run: _Run, exc: Exception) -> None:
        """A prefill that failed: its passage stays cold; wait longer after each failure in a row."""
        run.failed += 1
        run.failures_in_row += 1
        run.left_out += 1
        level = logging.WARNING if run.failed == 1 else logging.DEBUG  # one line per run, not per passage
        log.log(level, "warming: pre-filling passage %s failed (%r); skipped", passage.chunk.chunk_id, exc)
        wait = min(FAILURE_WAIT_MAX_S, FAILURE_WAIT_S * 2 ** (run.failures_in_row - 1))
        if isinstance(exc, Overloaded):
            wait = max(wait, exc.retry_after_ms / 1000.0)
        await asyncio.sleep(wait)

    def _candidates(self, serving: ServingVersion) -> tuple[list[Chunk], Sequence[Chunk]]:
        """The most retrieved passages, then (whole-corpus warming) the index's own order, which
        the index may decode only as it is read."""
        limit = self._policy.warm_passages
        index = serving.index
        ids = self._hot.top(limit)
        hot = index.chunks_by_id(ids) if ids else []
        corpus = index.chunks_in_order(limit) if self._policy.warm_whole_corpus and len(hot) < limit else []
        return hot, corpus

    async def _in_order(self, hot: list[Chunk], corpus: Sequence[Chunk], planned: int) -> AsyncIterator[Chunk]:
        """`planned` passages, each once: the hot ones, then the corpus's, read a few at a time on
        the model threads (a retrieval never waits behind one long read of the whole corpus)."""
        seen = {chunk.chunk_id for chunk in hot}
        given = 0
        for chunk in hot[:planned]:
            given += 1
            yield chunk
        for start in range(0, len(corpus), READ_BATCH):
            batch = await self._threads.run(lambda at=start: corpus[at : at + READ_BATCH])  # type: ignore[misc]
            for chunk in batch:
                if given >= planned:
                    return
                if chunk.chunk_id not in seen:
                    given += 1
                    yield chunk

    def _prompt(self, passage: Passage) -> Prompt:
        return build_prompt("", [passage], self._policy.prompt_layout, warmed=True)

    def _size(self, passage: Passage, template: int, room: int) -> int | None:
        """Tokens its prompt adds to the template's (markup and pad included), or None when it is too
        long to be reused or past `room` (its text is counted first: the prompt is rendered only for
        a passage that may fit)."""
        text = self._generator.count_tokens(passage.chunk.text.strip())
        if text > self._policy.whole_passage_max_tokens or text > room:
            return None
        size = self._generator.prompt_tokens(self._prompt(passage)) - template
        return size if size <= room else None

    def _publish(self, state: WarmState) -> None:
        self.state = state
        metrics.WARM_PASSAGES.set(state.passages)
        metrics.WARM_TOKENS.set(state.tokens)
        metrics.WARM_LEFT_OUT.set(state.left_out)
