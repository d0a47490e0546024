"""Retrieval first on a shared CPU: the in-process engine waits, between its steps and between
the layers of a step, while an interactive retrieval runs.

On a small host the engine's step (a prefill chunk, a decode with its OpenMP team on every core)
takes the whole CPU, and a retrieval beside it misses its budget: the budget can only cut between
stages, never give a stage CPU it does not get (BENCHMARKS.md, "The retrieval budget beside the
engine"). So the engine asks this gate before every step and before every decoder layer (a few
milliseconds each in eager mode) and rests while an interactive retrieval holds it. Batch
retrievals never hold it: they must not slow people's answers.

Retrievals one after another cannot stop generation: while they run, the engine still takes
ENGINE_SHARE of the time, a layer or a step at a time, and waits at most `longest_wait_s` at once.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from ragserve import metrics

# The engine's share of the time while retrievals run back to back: each unit it runs (a layer, a
# step's bookkeeping) is followed by a rest three times as long, so a retrieval keeps about three
# quarters of the CPU and another caller's answer still moves.
ENGINE_SHARE = 0.25


class RetrievalFirst:
    def __init__(self, longest_wait_s: float) -> None:
        """`longest_wait_s` <= 0: the gate is off (the engine never waits, retrievals are not counted)."""
        self._longest_wait_s = longest_wait_s
        self._retrieving = 0
        self._changed = threading.Condition()
        self._resumed = 0.0  # when the engine last went on from this gate (its unit since: its run)

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
        """On the engine thread, before a step or a layer: while a retrieval runs, rest for three
        times what the engine ran since its last turn (at most `longest_wait_s`, a retrieval's whole
        run after the engine sat idle), or until no retrieval runs; the seconds waited."""
        now = time.monotonic()
        ran, self._resumed = now - self._resumed, now
        if not self._retrieving or not self.enabled:
            return 0.0
        give_up = now + min(self._longest_wait_s, ran * (1.0 - ENGINE_SHARE) / ENGINE_SHARE)
        with self._changed:
            while self._retrieving:
                left = give_up - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
        self._resumed = time.monotonic()
        waited = self._resumed - now
        metrics.ENGINE_YIELD_SECONDS.inc(waited)
        return waited
