"""The engine's pace against its own pace alone (HostSharePace): what Info reports as "contended"."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest

from ragserve.events import GenerationChunk
from ragserve.generate import host_share as pace_module
from ragserve.generate.host_share import HostSharePace
from ragserve.prompt import Prompt
from ragserve.reports import HostShareState
from ragserve.types import GenerateParams
from tests.fakes import FakeClock, FakeGenerator


class FakeClockedGenerator(FakeGenerator):
    """Each word takes exactly `step_s` on `clock` (simulated time): no sleeping, no host speed."""

    def __init__(self, clock: FakeClock, step_s: float, words: list[str]) -> None:
        super().__init__(words=words)
        self.clock = clock
        self.step_s = step_s

    async def stream(self, prompt: Prompt, params: GenerateParams, trace_id: str) -> AsyncIterator[GenerationChunk]:
        async for chunk in super().stream(prompt, params, trace_id):
            self.clock.advance(self.step_s)
            yield chunk


def test_baseline_then_the_ratio_of_answers_that_had_the_engine_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # The baseline's arithmetic on a simulated clock; how fast this host decodes is a benchmark's
    # question, not a unit test's.
    clock = FakeClock()
    monkeypatch.setattr(pace_module, "time", SimpleNamespace(perf_counter=clock))
    pace = HostSharePace()
    assert pace.describe() == "not measured yet"
    asyncio.run(pace.measure_baseline(FakeClockedGenerator(clock, step_s=0.010, words=["a"] * 6)))
    # From the first token to the last: 5 gaps of 10 ms over 6 tokens (the first token's wait,
    # the prefill, is not decode pace).
    assert pace.baseline_ms is not None and pace.baseline_ms == pytest.approx(10.0)
    base = pace.baseline_ms
    for _ in range(5):
        pace.record(base * 1.2, had_engine_alone=True)
        pace.record(base * 10, had_engine_alone=False)  # batching, not a neighbour: left out
    ratio = pace.ratio()
    assert ratio is not None and abs(ratio - 1.2) < 1e-6
    assert pace.describe().startswith("normal")
    for _ in range(16):
        pace.record(base * 4, had_engine_alone=True)
    assert pace.describe().startswith("contended") and "4.0x" in pace.describe()


def test_an_engine_that_gave_a_neighbour_threads_is_reported_contended_at_its_normal_pace() -> None:
    pace = HostSharePace()
    gave_way = HostShareState(usable_cpus=2, neighbour_cpus=1.4, engine_threads=1, adaptive=True)
    quiet = HostShareState(usable_cpus=2, neighbour_cpus=0.1, engine_threads=2, adaptive=True)
    assert pace.describe(quiet) == "not measured yet"
    assert pace.describe(gave_way).startswith("contended: other processes keep 1.4 of this server's 2 CPUs")
    pace.baseline_ms = 10.0
    for _ in range(4):
        pace.record(10.0, had_engine_alone=True)
    assert pace.describe(quiet).startswith("normal (decode 1.0x")
    described = pace.describe(gave_way)
    assert described.startswith("contended: other processes") and "engine runs 1 thread(s)" in described
    assert "decode 1.0x" in described
    fixed_low = HostShareState(usable_cpus=2, neighbour_cpus=0.0, engine_threads=1, adaptive=False)
    assert pace.describe(fixed_low).startswith("normal")  # RAGSERVE_GENERATOR_THREADS=1: a choice, not a neighbour
