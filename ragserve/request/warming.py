"""Pre-filling the engine's prefix cache with the passages questions will reuse.

One entry point for every trigger: start, a newly published version, a generation server that
comes back with an empty cache. The most retrieved top passages (request/hot.py) go first, each
rendered exactly as a Query renders its top passage, within the policy's share of the KV cache.
Only the reusable layout renders a passage the same for every question, so only it can reuse them.
"""

from __future__ import annotations

import logging

from ragserve.generate.base import Generator
from ragserve.prompt import build_prompt
from ragserve.request.context import fit_context
from ragserve.request.hot import HotPassages
from ragserve.request.model_threads import ModelThreads
from ragserve.request.policy import AnswerPolicy
from ragserve.request.serving import ServingVersion
from ragserve.types import Passage

log = logging.getLogger(__name__)


class Warmer:
    def __init__(self, generator: Generator, policy: AnswerPolicy, hot: HotPassages, threads: ModelThreads) -> None:
        self._generator = generator
        self._policy = policy
        self._hot = hot
        self._threads = threads

    async def warm(self, serving: ServingVersion) -> int:
        """Pre-fill `serving`'s most retrieved top passages, one at a time; how many were warmed."""
        generator, policy = self._generator, self._policy
        if policy.warm_passages <= 0 or policy.prompt_layout != "reusable":
            return 0
        index = serving.index
        ids = self._hot.top(policy.warm_passages)
        chunks = await self._threads.run(lambda: index.chunks_by_id(ids)) if ids else []
        room = int(policy.warm_kv_share * await generator.kv_cache_tokens())
        warmed = 0
        for chunk in chunks:
            passage = Passage(chunk, 1.0, 1)
            text_tokens = generator.count_tokens(chunk.text.strip())
            tokens = fit_context("", [passage], 0, generator.count_tokens).tokens  # with its title
            if text_tokens > policy.whole_passage_max_tokens or tokens > room:
                continue  # served cut to the question (never reused), or past the share
            room -= tokens
            # The question comes last: every full KV block before it is this passage's, as served.
            await generator.prefill(build_prompt("", [passage], policy.prompt_layout))
            warmed += 1
        if warmed:
            log.info("pre-filled the prefix cache with %d of the most retrieved passages", warmed)
        return warmed
