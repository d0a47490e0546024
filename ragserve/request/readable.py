"""How many chunks a caller's grant may read, for Info: counted off the event loop, once per
index version and grant.

On Qdrant with access control an exact count is a round trip that walks the collection's payload
index; Info asked it on the event loop at every call, and every other call waited behind it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from ragserve.filters import Filter
from ragserve.request.serving import ServingVersion

# Distinct (version, grant) counts kept; the oldest goes first (grants are few: one per caller).
KEPT = 256


class ReadableCounts:
    def __init__(self) -> None:
        self._counts: OrderedDict[tuple[str, str], int] = OrderedDict()

    async def count(
        self, serving: ServingVersion, grant: Filter | None, off_loop: Callable[[Callable[[], int]], Awaitable[int]]
    ) -> int:
        """Chunks of `serving` that `grant` may read (all of them without one)."""
        index = serving.index
        if grant is None:
            return index.count
        # A digest, not the filter: a grant may be large, and only its meaning matters here.
        key = (serving.identity, hashlib.blake2b(repr(grant).encode(), digest_size=16).hexdigest())
        if key in self._counts:
            self._counts.move_to_end(key)
            return self._counts[key]
        counted = await off_loop(lambda: index.count_matching(grant))
        self._counts[key] = counted
        if len(self._counts) > KEPT:
            self._counts.popitem(last=False)
        return counted
