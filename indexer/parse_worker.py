"""HTML and PDF parsed in a worker process of their own, so a file's time and memory caps are real
bounds (a thread cannot be stopped mid-parse; a process can)."""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.pool
from typing import Any, cast

from indexer.formats import Extracted, FileRejected, LoadLimits, Reader

WORKER_START_TIMEOUT_S = 120.0


def _import_parsers() -> None:
    import bs4  # noqa: F401
    import pypdf  # noqa: F401


def _cap_memory(megabytes: int) -> None:
    """The worker's initializer: an allocation past the cap raises MemoryError in the worker."""
    try:
        import resource
    except ImportError:  # not on Windows: only the time cap applies there
        return
    cap = megabytes * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


def _parse_capped(reader: Reader, data: bytes, limits: LoadLimits) -> Extracted | None:
    """In the worker: the reader's result, or None when it ran out of memory. The error itself is not
    sent back: its traceback holds the half-built tree, and pickling it would need memory too."""
    try:
        return reader(data, limits)
    except MemoryError:
        pass  # leaving the handler drops the traceback, and with it the tree
    gc.collect()
    return None


# Not in typeshed's stub of multiprocessing.pool; the class is there since Python 3.3.
_MaybeEncodingError: type[Exception] = getattr(multiprocessing.pool, "MaybeEncodingError", Exception)


class IsolatedParser:
    """Runs HTML/PDF parsing in one worker process, killed and replaced when a file overruns its time
    or its memory.

    A thread cannot be stopped mid-parse; a process can, so the time cap is a real bound, and the
    memory cap applies to the worker alone. The worker is started with "spawn" (not fork): the
    indexer may already hold a model's threads.
    """

    def __init__(self) -> None:
        self._pool: Any = None
        self._memory_mb = 0

    def parse(self, reader: Reader, data: bytes, limits: LoadLimits) -> Extracted:
        if self._pool is not None and self._memory_mb != limits.parse_memory_mb:
            self.close()
        if self._pool is None:
            self._memory_mb = limits.parse_memory_mb
            context = multiprocessing.get_context("spawn")
            self._pool = context.Pool(1, initializer=_cap_memory, initargs=(limits.parse_memory_mb,))
            # Start-up and library imports take seconds on a busy host: not part of any file's time.
            self._pool.apply_async(_import_parsers).get(timeout=WORKER_START_TIMEOUT_S)
        pending = self._pool.apply_async(_parse_capped, (reader, data, limits))
        try:
            result = cast(Extracted | None, pending.get(timeout=limits.parse_timeout_s))
        except multiprocessing.TimeoutError:
            self.close()
            raise FileRejected(f"parsing took longer than the limit of {limits.parse_timeout_s:g} s") from None
        except _MaybeEncodingError:
            # Pickling the result failed in the worker (out of memory under its cap, or a value that
            # cannot be pickled): the worker may be left in any state, so a new one takes over.
            self.close()
            raise FileRejected("the parsed text could not be sent back from the parse worker") from None
        if result is None:
            self.close()  # a worker that ran out of memory may be left in any state: start a new one
            raise FileRejected(f"parsing needed more than the limit of {limits.parse_memory_mb:,} MB")
        return result

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None
