"""The default store: an in-process LRU with a TTL and bounds on entries and bytes."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from ragserve.config import CacheSettings, default_of


class MemoryStore:
    """Used from one event loop only: no awaits inside an operation, so no lock is needed."""

    name = "memory"

    def __init__(
        self,
        max_entries: int = default_of(CacheSettings, "max_entries"),
        max_bytes: int = default_of(CacheSettings, "max_bytes"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("max_entries and max_bytes must be >= 1")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._clock = clock
        self._data: OrderedDict[str, tuple[float, bytes]] = OrderedDict()  # key -> (expires_at, value)
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._data)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def _drop(self, key: str) -> None:
        _, value = self._data.pop(key)
        self._bytes -= len(value)

    async def get(self, key: str) -> bytes | None:
        item = self._data.get(key)
        if item is None:
            return None
        expires_at, value = item
        if expires_at <= self._clock():
            self._drop(key)
            return None
        self._data.move_to_end(key)
        return value

    async def set(self, key: str, value: bytes, ttl_s: float) -> None:
        if len(value) > self.max_bytes or ttl_s <= 0:
            return
        if key in self._data:
            self._drop(key)
        self._data[key] = (self._clock() + ttl_s, value)
        self._bytes += len(value)
        # Evict least recently used entries until both bounds hold.
        while len(self._data) > self.max_entries or self._bytes > self.max_bytes:
            self._drop(next(iter(self._data)))

    async def ping(self) -> None:
        return None

    async def connect(self) -> None:
        return None

    async def flush(self) -> int:
        dropped = len(self._data)
        self._data.clear()
        self._bytes = 0
        return dropped

    async def close(self) -> None:
        return None
