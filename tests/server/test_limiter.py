from __future__ import annotations

import asyncio
import contextlib

import pytest

from ragserve import metrics
from ragserve.errors import Overloaded
from ragserve.server.limiter import InFlightLimiter
from ragserve.types import RequestClass

BATCH, INTERACTIVE = RequestClass.BATCH, RequestClass.INTERACTIVE


def test_a_burst_admits_exactly_the_bound_and_rejects_the_rest() -> None:
    limiter = InFlightLimiter(8, retry_after_ms=150)
    admitted = rejected = peak = 0
    release = asyncio.Event()
    pushbacks: set[int] = set()

    async def one() -> None:
        nonlocal admitted, rejected, peak
        try:
            with limiter.admit():
                admitted += 1
                peak = max(peak, limiter.in_flight)
                await release.wait()
        except Overloaded as exc:
            rejected += 1
            pushbacks.add(exc.retry_after_ms)

    async def burst() -> None:
        tasks = [asyncio.create_task(one()) for _ in range(1000)]
        await asyncio.sleep(0.05)
        assert limiter.in_flight == 8
        release.set()
        await asyncio.gather(*tasks)

    asyncio.run(burst())
    assert (admitted, rejected, peak) == (8, 992, 8)
    assert pushbacks == {150}
    assert limiter.in_flight == 0


def test_a_failing_request_releases_its_slot() -> None:
    limiter = InFlightLimiter(1)
    with pytest.raises(ValueError), limiter.admit():
        raise ValueError("boom")
    with limiter.admit():
        assert limiter.in_flight == 1


def _shed(request_class: RequestClass) -> float:
    return metrics.SHED.labels(request_class.value)._value.get()


def test_batch_gets_its_share_and_is_refused_first() -> None:
    limiter = InFlightLimiter(8, batch_max_share=0.5, interactive_reserved=2)
    assert limiter.batch_max == 4
    shed_before = _shed(BATCH)
    with contextlib.ExitStack() as held:
        for _ in range(4):
            held.enter_context(limiter.admit(BATCH))
        with pytest.raises(Overloaded, match="batch limit 4"):
            held.enter_context(limiter.admit(BATCH))
        # People still get every other slot.
        for _ in range(4):
            held.enter_context(limiter.admit(INTERACTIVE))
        with pytest.raises(Overloaded):
            held.enter_context(limiter.admit(INTERACTIVE))
    assert _shed(BATCH) == shed_before + 1
    assert (limiter.in_flight, limiter.batch_in_flight) == (0, 0)


def test_batch_never_takes_the_slots_kept_for_people() -> None:
    limiter = InFlightLimiter(4, batch_max_share=1.0, interactive_reserved=1)
    assert limiter.batch_max == 3
    with contextlib.ExitStack() as held:
        for _ in range(3):
            held.enter_context(limiter.admit(BATCH))
        with pytest.raises(Overloaded):
            held.enter_context(limiter.admit(BATCH))
        held.enter_context(limiter.admit(INTERACTIVE))  # the kept slot
    # A tiny server still lets one batch request in.
    assert InFlightLimiter(1, interactive_reserved=2).batch_max == 1
