"""Hot reload: watch where versions are published (an index root's CURRENT link, or a Qdrant
alias), verify a new version, swap it in.

The swap is one reference assignment (`pipeline.swap_index(new)`), atomic under the GIL. A request
reads `pipeline.index` once and keeps that object for its whole life, so in-flight requests
finish on the old version and the old version is freed when the last of them drops it. A version
that fails verification (checksums, counts, embedder) is refused with one log line and the old
one keeps serving; it is not retried until something else is published. A source that cannot be
read at all (a Qdrant server unreachable, say) says nothing about the version: it is retried,
with back-off.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from ragserve.config import IndexSettings, default_of
from ragserve.errors import IndexLoadError, RagError
from ragserve.index.base import SearchIndex
from ragserve.index.format import CURRENT, manifest_identity, read_manifest_bytes
from ragserve.index.graph import open_in_process
from ragserve.index.hnsw import DEFAULT_EXACT_SCAN_MAX, GraphOpener, HnswIndex

log = logging.getLogger(__name__)

# An absolute path in an error message (a word that starts with "/"): Info shows why a version was
# refused without the server's paths; the log line keeps them.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.])/[^\s:'\"]*")


def without_paths(reason: str) -> str:
    return _ABSOLUTE_PATH.sub("<path>", reason)


def version_marker(name: str, identity: str) -> str:
    """A published version as the watcher compares them: where it is and what it holds. A root
    rebuilt from scratch publishes v000001 again, with other content: that is a new version."""
    return f"{name}#{identity}"


def published_marker(root: Path) -> str | None:
    """What CURRENT points to and its manifest's identity (one readlink, one small read per check),
    or None when nothing is published."""
    try:
        name = os.readlink(root / CURRENT)
    except OSError:
        return None
    try:
        return version_marker(name, manifest_identity(read_manifest_bytes(root / name)))
    except IndexLoadError:
        return name  # no readable manifest: loading it will say why, once


# Longest wait between checks of a source that could not be read.
_MAX_RETRY_S = 60.0


class IndexWatch(Protocol):
    """How one backend publishes: what is published now, how to load it, what a loaded version was."""

    def published(self) -> str | None:
        """A marker of the version published now (None: nothing is); blocking."""
        ...

    def load(self) -> SearchIndex:
        """The published version, verified (raises a RagError when it must be refused)."""
        ...

    def served(self, index: SearchIndex) -> str | None:
        """The marker `index` was published under."""
        ...


class ServedIndex(Protocol):
    """What serves an index and takes a new one (the pipeline)."""

    @property
    def index(self) -> SearchIndex: ...

    def swap_index(self, index: SearchIndex) -> None:
        """Load what `index` serves with and serve it from the next request on (blocking); raises a
        RagError when the version must be refused."""
        ...

    def refused(self, reason: str) -> None:
        """A newly published version was refused (the current one keeps serving)."""
        ...


class FolderWatch:
    """An index root: CURRENT links to the published version's folder."""

    def __init__(
        self, root: Path, exact_scan_max: int = DEFAULT_EXACT_SCAN_MAX, open_graph: GraphOpener = open_in_process
    ) -> None:
        self.root = root
        self.exact_scan_max = exact_scan_max
        self.open_graph = open_graph

    def published(self) -> str | None:
        return published_marker(self.root)

    def load(self) -> SearchIndex:
        return HnswIndex.load(self.root, self.exact_scan_max, self.open_graph, reloading=True)

    def served(self, index: SearchIndex) -> str | None:
        return version_marker(index.source, index.identity)


class IndexReloader:
    def __init__(
        self,
        watch: IndexWatch,
        target: ServedIndex,
        accept: Callable[[SearchIndex], None] | None = None,
        interval_s: float = default_of(IndexSettings, "reload_interval_s"),
        clock: Callable[[], float] = time.monotonic,
        after_swap: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        """`after_swap`: started on the event loop after each swap (e.g. warming the new version), in
        the background: a slow or hung step never holds back the next version. A swap that comes
        while the previous one's step still runs cancels it (it was for an older version)."""
        self._watch = watch
        self._target = target
        self._accept = accept
        self.interval_s = interval_s
        # What the serving version was published as. Asking the source instead would skip a
        # version published between the server's load and this moment.
        seen = watch.served(target.index)
        self._seen = seen if seen is not None else watch.published()
        self._clock = clock
        self._after_swap = after_swap
        self._after_swap_task: asyncio.Task[None] | None = None
        self._failures = 0
        self._retry_at = 0.0
        self.reloads = 0
        self.refused = 0

    def check_once(self) -> bool:
        """Load and swap if a new version was published; True if a swap happened. Blocking."""
        if self._clock() < self._retry_at:
            return False
        old = self._target.index
        try:
            marker = self._watch.published()
        except Exception as exc:
            return self._unreadable(exc, old)
        if marker is None or marker == self._seen:
            self._failures = 0
            return False
        try:
            new = self._watch.load()  # verifies every checksum before anything is swapped
            if self._accept is not None:
                self._accept(new)
            swapped = new.identity != old.identity
            if swapped:
                self._target.swap_index(new)  # the models it ships load (and are checked) first
        except RagError as exc:
            self._seen = marker
            self.refused += 1
            self._target.refused(f"{marker}: {without_paths(str(exc))}")
            log.error("refusing newly published index %s: %s; still serving version %s", marker, exc, old.version)
            return False
        except Exception as exc:
            return self._unreadable(exc, old)
        self._failures = 0
        self._seen = marker
        if not swapped:
            return False
        self.reloads += 1
        log.info(
            "index reloaded: version %s (%s) -> %s (%s), %d chunks",
            old.version,
            old.identity,
            new.version,
            new.identity,
            new.count,
        )
        return True

    def _unreadable(self, exc: Exception, old: SearchIndex) -> bool:
        """The source could not be read: no verdict on the version; check again after a back-off."""
        self._failures += 1
        delay = min(self.interval_s * 2**self._failures, _MAX_RETRY_S)
        self._retry_at = self._clock() + delay
        log.warning(
            "index source unreadable (%s: %s); still serving version %s, next check in %.0f s",
            type(exc).__name__,
            exc,
            old.version,
            delay,
        )
        return False

    async def run(self) -> None:
        """Poll until cancelled. Loading runs on a worker thread: queries are never blocked by it."""
        try:
            while True:
                await asyncio.sleep(self.interval_s)
                try:
                    if await asyncio.to_thread(self.check_once):
                        self._start_after_swap()
                except asyncio.CancelledError:
                    raise
                except Exception:  # a bug here must not kill the watcher or the server
                    log.exception("index reload check failed; still serving the loaded version")
        finally:
            if self._after_swap_task is not None:
                self._after_swap_task.cancel()

    def _start_after_swap(self) -> None:
        if self._after_swap is None:
            return
        if self._after_swap_task is not None and not self._after_swap_task.done():
            self._after_swap_task.cancel()
        self._after_swap_task = asyncio.create_task(_logged(self._after_swap()))


async def _logged(step: Awaitable[object]) -> None:
    try:
        await step
    except Exception:  # logged, never left for the garbage collector to report
        log.exception("the step after an index swap failed")
