"""The start-up heap frozen (ragserve/heap.py): out of the collector's sight, still freed when unused."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from ragserve.heap import freeze_start_up_heap


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture
def frozen() -> Iterator[int]:
    count, _ = freeze_start_up_heap()
    try:
        yield count
    finally:
        gc.unfreeze()  # the rest of the test run collects as before


def test_what_lived_at_start_up_is_frozen_and_what_came_after_is_collected(frozen: int) -> None:
    assert frozen > 1000 and gc.get_freeze_count() > 1000  # this process's modules at least
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle made after the freeze: the collector still finds it
    gone = weakref.ref(a)
    del a, b
    assert gc.collect() >= 2 and gone() is None


def test_a_frozen_object_nothing_refers_to_is_still_freed() -> None:
    kept = Node()
    gone = weakref.ref(kept)
    freeze_start_up_heap()
    try:
        del kept  # reference counting frees it; only a frozen cycle would stay
        assert gone() is None
    finally:
        gc.unfreeze()
