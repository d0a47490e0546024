"""Retrieval first on a shared CPU: the in-process engine waits between its steps while an
interactive retrieval runs.

On a small host the engine's step (a prefill chunk, a decode with its OpenMP team on every core)
takes the whole CPU, and a retrieval beside it misses its budget: the budget can only cut between
stages, never give a stage CPU it does not get (BENCHMARKS.md, "The retrieval budget beside the
engine"). A step cannot be interrupted, but it is short (the engine's step target bounds prefill
chunks), so between steps the engine asks this gate and waits while an interactive retrieval holds
it. Batch retrievals never hold it: they must not slow people's answers.

A run of retrievals cannot stop generation: after waiting `longest_wait_s` in a row the engine runs
for at least as long before it waits again.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from ragserve import metrics


class RetrievalFirst:
    def __init__(self, longest_wait_s: float) -> None:
        """`longest_wait_s` <= 0: the engine never waits (the gate only counts)."""
        self._longest_wait_s = longest_wait_s
        self._retrieving = 0
        self._changed = threading.Condition()
        self._runs_until = 0.0  # after a wait cut short, the engine runs until then without waiting

    @property
    def enabled(self) -> bool:
        return self._longest_wait_s > 0

    @contextlib.contextmanager
    def retrieving(self, interactive: bool = True) -> Iterator[None]:
        """Around one retrieval (embedding, search, rerank, evidence, reader), on any thread."""
        if not interactive or not self.enabled:
            yield
            return
        with self._changed:
            self._retrieving += 1
        try:
            yield
        finally:
            with self._changed:
                self._retrieving -= 1
                if not self._retrieving:
                    self._changed.notify_all()

    def retrieving_now(self) -> int:
        return self._retrieving

    def wait_turn(self) -> float:
        """On the engine thread, before a step: wait while a retrieval runs; the seconds waited."""
        if not self._retrieving or not self.enabled:
            return 0.0
        started = time.monotonic()
        if started < self._runs_until:
            return 0.0
        give_up = started + self._longest_wait_s
        with self._changed:
            while self._retrieving:
                left = give_up - time.monotonic()
                if left <= 0:
                    # Cut short: the engine now runs as long as it waited before it yields again.
                    self._runs_until = time.monotonic() + self._longest_wait_s
                    break
                self._changed.wait(left)
        waited = time.monotonic() - started
        metrics.ENGINE_YIELD_SECONDS.inc(waited)
        return waited
