"""Info's readable-chunk count: off the event loop, once per index version and grant."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from ragserve.filters import Filter, Match
from ragserve.request.readable import KEPT, ReadableCounts


class CountingIndex:
    """A fake index that counts its counts and the threads they ran on."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.asked = 0
        self.threads: set[str] = set()

    def count_matching(self, grant: Filter | None) -> int:
        self.asked += 1
        self.threads.add(threading.current_thread().name)
        return 7


def _serving(index: CountingIndex, identity: str) -> Any:
    return SimpleNamespace(index=index, identity=identity)


async def _off_loop(fn: Callable[[], int]) -> int:
    return await asyncio.to_thread(fn)


def _grant(group: str) -> Filter:
    return Filter(must=(Match("groups", (group,), any=True),))


def test_a_grant_is_counted_off_the_loop_once_per_version() -> None:
    index = CountingIndex(111)
    counts = ReadableCounts()

    async def run() -> list[int]:
        v1, v2 = _serving(index, "v1"), _serving(index, "v2")
        return [
            await counts.count(v1, _grant("a"), _off_loop),
            await counts.count(v1, _grant("a"), _off_loop),  # the same grant again: cached
            await counts.count(v1, _grant("b"), _off_loop),  # another grant: counted
            await counts.count(v2, _grant("a"), _off_loop),  # a new version: counted again
            await counts.count(v1, None, _off_loop),  # no grant: the whole index, nothing asked
        ]

    assert asyncio.run(run()) == [7, 7, 7, 7, 111]
    assert index.asked == 3
    assert threading.main_thread().name not in index.threads


def test_the_counts_kept_are_bounded() -> None:
    index = CountingIndex(111)
    counts = ReadableCounts()

    async def run() -> None:
        for number in range(KEPT + 10):
            await counts.count(_serving(index, "v1"), _grant(f"g{number}"), _off_loop)
        await counts.count(_serving(index, "v1"), _grant("g0"), _off_loop)  # the oldest was dropped

    asyncio.run(run())
    assert index.asked == KEPT + 11
    assert len(counts._counts) == KEPT
