"""The engine's pace against its own pace alone: what Info and the metrics call contention."""

from __future__ import annotations

import asyncio

from ragserve.request.pace import PaceMonitor
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
