"""Is the engine running at this host's pace? A busy neighbour (an app, an indexer) shows as decode
steps far slower than the same engine measured alone at start-up.

The baseline: time per output token of a fixed prompt, measured right after the engine starts.
Afterwards every answer that had the engine to itself (no other request unfinished when it started
or ended) adds its time per output token to a window; the median of the window over the baseline
is the pace ratio. Answers that shared the engine are left out (batching slows steps by design).
"""

from __future__ import annotations

import statistics
import time
from collections import deque

from ragserve import metrics
from ragserve.generate.base import Generator
from ragserve.prompt import build_prompt
from ragserve.types import GenerateParams, HostShareState

# Speculation makes single answers vary by up to ~2x in ms/token; a neighbour taking a core from a
# 2-thread engine made it 2.4-4.2x (BENCHMARKS.md, "A busy neighbour"): flagged from 2.5x.
CONTENDED_RATIO = 2.5
_WINDOW = 16
_BASELINE_PROMPT = build_prompt("List the numbers from one to twenty.", [])
_BASELINE_TOKENS = 24


class PaceMonitor:
    def __init__(self) -> None:
        self.baseline_ms: float | None = None
        self._recent: deque[float] = deque(maxlen=_WINDOW)

    async def measure_baseline(self, generator: Generator) -> None:
        """Time per output token of a fixed prompt, on the idle engine (after its warm-up)."""
        first: float | None = None
        tokens = 0
        async for chunk in generator.stream(_BASELINE_PROMPT, GenerateParams(_BASELINE_TOKENS, 0.0), "pace-baseline"):
            if chunk.text and first is None:
                first = time.perf_counter()
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        if first is not None and tokens > 1:
            self.baseline_ms = (time.perf_counter() - first) * 1000.0 / (tokens - 1)

    def record(self, time_per_output_token_ms: float, had_engine_alone: bool) -> None:
        if had_engine_alone and time_per_output_token_ms > 0:
            self._recent.append(time_per_output_token_ms)
            ratio = self.ratio()
            if ratio is not None:
                metrics.GENERATOR_PACE_RATIO.set(ratio)

    def ratio(self) -> float | None:
        """Recent ms/token over the start-up baseline (None until both are known)."""
        if self.baseline_ms is None or len(self._recent) < 3:
            return None
        return statistics.median(self._recent) / self.baseline_ms

    def describe(self, share: HostShareState | None = None) -> str:
        """For Info: the pace and whether the host looks contended. `share`: what other processes
        take of the engine's CPUs; an engine that gave them threads keeps its pace per thread, so
        the pace alone would say "normal" beside a busy neighbour."""
        ratio = self.ratio()
        # Only a count that follows the neighbours says one is there (a fixed count is a choice).
        gave_way = share is not None and share.adaptive and share.engine_threads < share.usable_cpus
        if ratio is None and not gave_way:
            return "not measured yet"
        if ratio is not None and ratio >= CONTENDED_RATIO:
            state = "contended: something else is using this engine's CPUs"
        elif gave_way:
            assert share is not None
            state = (
                f"contended: other processes keep {share.neighbour_cpus:.1f} of this server's "
                f"{share.usable_cpus} CPUs busy; the engine runs {share.engine_threads} thread(s)"
            )
        else:
            state = "normal"
        if ratio is None:
            return state
        return f"{state} (decode {ratio:.1f}x its pace alone, {self.baseline_ms:.1f} ms/token)"
