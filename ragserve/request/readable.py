"""What a caller's grant may read: how many chunks, for Info (counted off the event loop, once per
index version and grant), and which chunks of those asked for by id (the MCP door's fetch).

On Qdrant with access control an exact count is a round trip that walks the collection's payload
index; Info asked it on the event loop at every call, and every other call waited behind it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from ragserve.filters import Filter, matches
from ragserve.index.base import SearchIndex
from ragserve.request.serving import ServingVersion
from ragserve.types import Chunk

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


# Chunks one fetch of a whole document may return (a document's chunks are `doc_id#0`, `#1`, ...).
MOST_CHUNKS_A_DOCUMENT = 256


def readable_chunks(index: SearchIndex, chunk_id: str, doc_id: str, grant: Filter | None) -> list[Chunk]:
    """The chunk `chunk_id`, or the chunks of `doc_id` in order, that `grant` may read: a chunk
    outside the grant and one that does not exist are both simply absent, so a caller cannot tell
    them apart, in what is returned and in the time it takes: the index checks the grant before it
    reads a chunk, so an ungranted id costs what an unknown one does (a lookup, nothing decoded).
    Blocking (a Qdrant index asks its server): run it off the event loop."""
    wanted = [chunk_id] if chunk_id else [f"{doc_id}#{n}" for n in range(MOST_CHUNKS_A_DOCUMENT)]
    found = index.chunks_by_id(wanted, grant)
    if doc_id:
        found = [chunk for chunk in found if chunk.doc_id == doc_id]
    # Checked again on what was read (only granted chunks are): the grant holds whatever the index.
    return [chunk for chunk in found if matches(grant, chunk.metadata, index.fields)]
