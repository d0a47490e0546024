"""The sha256 of a file, read in blocks: every manifest (index versions, reader folders) lists one."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ragserve.priority import at_lower_priority


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_files(paths: list[Path], nice: int = 0) -> list[str]:
    """The digests of `paths`, in order. With `nice` > 0, one file after another on a thread of that
    much lower CPU priority (hashlib lets go of the GIL over big blocks: only the cores are shared,
    and requests get them first); else a file per core (a start-up: nothing to share them with)."""
    if nice > 0:
        return at_lower_priority(lambda: [sha256_file(path) for path in paths], nice)
    with ThreadPoolExecutor(max(1, min(len(paths), os.cpu_count() or 1))) as pool:
        return list(pool.map(sha256_file, paths))


def forget_cached(paths: list[Path]) -> None:
    """Ask the kernel to drop these files' pages from the page cache (Linux; a hint elsewhere
    ignored): for files whose content was just read into memory (a graph, BM25's arrays), so
    their pages do not push out the ones requests read (the mapped docstore) on a full host."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass
        finally:
            os.close(fd)
