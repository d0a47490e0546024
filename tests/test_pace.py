"""The engine's pace against its own pace alone: what Info and the metrics call contention."""

from __future__ import annotations

import asyncio

from ragserve.request.pace import PaceMonitor
from ragserve.types import HostShareState
from tests.fakes import FakeGenerator


def test_baseline_then_the_ratio_of_answers_that_had_the_engine_alone() -> None:
    pace = PaceMonitor()
    assert pace.describe() == "not measured yet"
    asyncio.run(pace.measure_baseline(FakeGenerator(words=["a"] * 6, delay_s=0.01)))
    assert pace.baseline_ms is not None and 8 < pace.baseline_ms < 40
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
    pace = PaceMonitor()
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
