from __future__ import annotations

import asyncio

import pytest

from ragserve.errors import Overloaded
from ragserve.server.limiter import InFlightLimiter


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
