"""One indexer at a time per index root: a kernel lock on a file in the root."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = ".indexer.lock"


class IndexRootLocked(Exception):
    """Another indexer is building into the same index root."""


_held_roots: dict[Path, int] = {}


@contextmanager
def index_root_lock(root: Path) -> Iterator[None]:
    """Hold the index root for one indexer at a time; a second one fails at once, not after embedding.

    flock is released by the kernel when the holder exits, even by kill -9, so a crash leaves no
    stale lock. Re-entrant within a process (the CLI holds it across build and Qdrant publish).
    """
    root.mkdir(parents=True, exist_ok=True)
    key = root.resolve()
    if key in _held_roots:
        _held_roots[key] += 1
        try:
            yield
        finally:
            _held_roots[key] -= 1
        return
    fd = os.open(key / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise IndexRootLocked(
                f"another indexer is building into {root} (it holds {key / LOCK_FILE}); "
                "wait for it to finish, then run again"
            ) from None
        _held_roots[key] = 1
        try:
            yield
        finally:
            del _held_roots[key]
    finally:
        os.close(fd)  # closing the descriptor releases the lock
