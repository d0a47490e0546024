"""Hot reload: watch the index root for a newly published version, verify it, swap it in.

The swap is one reference assignment (`pipeline.index = new`), atomic under the GIL. A request
reads `pipeline.index` once and keeps that object for its whole life, so in-flight requests
finish on the old version and the old version is freed when the last of them drops it. A version
that fails verification (checksums, counts, embedder) is refused with one log line and the old
one keeps serving; it is not retried until CURRENT points somewhere else.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

from ragserve.errors import RagError
from ragserve.index.base import SearchIndex
from ragserve.index.format import CURRENT

log = logging.getLogger(__name__)


def published_marker(root: Path) -> str | None:
    """What CURRENT points to (cheap: one readlink), or None when nothing is published."""
    try:
        return os.readlink(root / CURRENT)
    except OSError:
        return None


class IndexReloader:
    def __init__(
        self,
        marker: Callable[[], str | None],
        load: Callable[[], SearchIndex],
        swap: Callable[[SearchIndex], None],
        current: Callable[[], SearchIndex],
        accept: Callable[[SearchIndex], None] | None = None,
        interval_s: float = 2.0,
    ) -> None:
        self._marker = marker
        self._load = load
        self._swap = swap
        self._current = current
        self._accept = accept
        self.interval_s = interval_s
        self._seen = marker()  # what the server loaded at start-up
        self.reloads = 0
        self.refused = 0

    def check_once(self) -> bool:
        """Load and swap if a new version was published; True if a swap happened. Blocking."""
        marker = self._marker()
        if marker is None or marker == self._seen:
            return False
        previous, self._seen = self._seen, marker
        old = self._current()
        try:
            new = self._load()  # verifies every checksum before anything is swapped
            if self._accept is not None:
                self._accept(new)
        except RagError as exc:
            self.refused += 1
            log.error("refusing newly published index %s: %s; still serving version %s", marker, exc, old.version)
            return False
        except Exception:
            # Not a verdict on the version (e.g. a Qdrant server briefly unreachable): try it again.
            self._seen = previous
            raise
        if new.version == old.version:
            return False
        self._swap(new)
        self.reloads += 1
        log.info("index reloaded: version %s -> %s (%d chunks)", old.version, new.version, new.count)
        return True

    async def run(self) -> None:
        """Poll until cancelled. Loading runs on a worker thread: queries are never blocked by it."""
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await asyncio.to_thread(self.check_once)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not kill the watcher or the server
                log.exception("index reload check failed; still serving the loaded version")
