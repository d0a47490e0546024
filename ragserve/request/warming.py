"""Pre-filling the engine's prefix cache with the passages questions will reuse.

One entry point for every trigger: start (in the background, once the server is SERVING), a newly
published version, a generation server that comes back with an empty cache. The most retrieved top
passages (request/hot.py) go first, then (RAGSERVE_WARM_WHOLE_CORPUS) the rest of the corpus in the
index's order, each rendered exactly as a Query renders its top passage, until the policy's share
of the KV cache is used; what does not fit is counted as left out. Warming runs at batch priority
and pauses while an interactive Query runs, so a person never waits behind it. Only the reusable
layout renders a passage the same for every question, so only it can reuse them.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ragserve import metrics
from ragserve.generate.base import Generator
from ragserve.prompt import Prompt, build_prompt
from ragserve.request.hot import HotPassages
from ragserve.request.model_threads import CURRENT_CLASS, ModelThreads
from ragserve.request.policy import AnswerPolicy
from ragserve.request.serving import ServingVersion
from ragserve.types import Chunk, Passage, RequestClass, WarmState

log = logging.getLogger(__name__)

# Warming resumes only after this long without interactive Query traffic: a person asking question
# after question never finds a warming prefill in the engine ahead of the next one.
QUIET_S = 0.25


class InteractiveTraffic:
    """Interactive Queries running now, and when the last one ended (warming waits for quiet)."""

    def __init__(self) -> None:
        self._running = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._last_end = 0.0

    def begin(self) -> None:
        self._running += 1
        self._idle.clear()

    def end(self) -> None:
        self._running -= 1
        if not self._running:
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


class Warmer:
    def __init__(
        self,
        generator: Generator,
        policy: AnswerPolicy,
        hot: HotPassages,
        threads: ModelThreads,
        traffic: InteractiveTraffic | None = None,
    ) -> None:
        """`traffic`: the interactive Queries warming gives way to, between passages."""
        self._generator = generator
        self._policy = policy
        self._hot = hot
        self._threads = threads
        self._traffic = traffic
        self.state = WarmState()
        self._warm_ids: frozenset[str] = frozenset()
        self._lock = asyncio.Lock()

    def is_warm(self, chunk_id: str) -> bool:
        return chunk_id in self._warm_ids

    async def warm(self, serving: ServingVersion) -> int:
        """Pre-fill `serving`'s passages, one at a time; how many were warmed."""
        if self._policy.warm_passages <= 0 or self._policy.prompt_layout != "reusable":
            self._publish(WarmState(serving.identity, left_out=serving.index.count, done=True))  # nothing to do
            return 0
        async with self._lock:  # a later trigger waits for (or, cancelled, replaces) the one running
            CURRENT_CLASS.set(RequestClass.BATCH)  # its model-thread work queues after people's
            return await self._warm(serving)

    async def _warm(self, serving: ServingVersion) -> int:
        started = time.perf_counter()
        generator, policy, index = self._generator, self._policy, serving.index
        self._warm_ids = frozenset()
        self._publish(WarmState(serving.identity))
        chunks = await self._threads.run(lambda: self._candidates(serving))
        room = int(policy.warm_kv_share * await generator.kv_cache_tokens())
        # Every prompt shares the template's KV: a passage takes what its prompt adds to it.
        template = await self._threads.run(lambda: generator.prompt_tokens(build_prompt("", [], policy.prompt_layout)))
        warm: set[str] = set()
        tokens = left_out = 0
        for chunk in chunks:
            passage = Passage(chunk, 1.0, 1)
            size = await self._threads.run(lambda p=passage, r=room: self._size(p, template, r))  # type: ignore[misc]
            if size is None:
                left_out += 1  # served cut to the question (never reused), or past the share
                continue
            if self._traffic is not None:
                await self._traffic.wait_quiet()
            room -= size
            # The question comes last: every full KV block before it is this passage's, as served.
            await generator.prefill(self._prompt(passage))
            warm.add(chunk.chunk_id)
            tokens += size
            self._warm_ids = frozenset(warm)
            self._publish(WarmState(serving.identity, len(warm), tokens, 0))
        left_out += max(0, index.count - len(chunks))
        state = WarmState(serving.identity, len(warm), tokens, left_out, True, time.perf_counter() - started)
        self._publish(state)
        log.info(
            "warming done for index version %s: %d passages (%d tokens) pre-filled in %.1f s; %d left cold "
            "(past RAGSERVE_WARM_KV_SHARE, or too long to reuse)",
            serving.version, state.passages, state.tokens, state.seconds, state.left_out,
        )  # fmt: skip
        return state.passages

    def _candidates(self, serving: ServingVersion) -> list[Chunk]:
        """The most retrieved passages first, then the index's own order, each once."""
        limit = self._policy.warm_passages
        index = serving.index
        ids = self._hot.top(limit)
        chunks = index.chunks_by_id(ids) if ids else []
        if self._policy.warm_whole_corpus and len(chunks) < limit:
            seen = {chunk.chunk_id for chunk in chunks}
            chunks += [c for c in index.chunks_in_order(limit) if c.chunk_id not in seen][: limit - len(chunks)]
        return chunks

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
