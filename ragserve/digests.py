"""The sha256 of a file, read in blocks: every manifest (index versions, reader folders) lists one."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_files(paths: list[Path], nice: int = 0) -> list[str]:
    """The digests of `paths`, in order. With `nice` > 0 (a reload: requests are being served), one
    file after another in a child process of that much lower CPU priority; else a file per core
    (a start-up: nothing to share them with). Raises OSError when a file cannot be read."""
    if nice > 0:
        return _in_child(paths, nice)
    with ThreadPoolExecutor(max(1, min(len(paths), os.cpu_count() or 1))) as pool:
        return list(pool.map(sha256_file, paths))


def _in_child(paths: list[Path], nice: int) -> list[str]:
    """Not a thread of the server: there each 1 MiB block took the GIL twice, and a low-priority
    thread the scheduler left waiting held up the requests queued behind it for the GIL."""
    if not paths:
        return []
    command = [sys.executable, "-m", "ragserve.digests", str(nice), *(str(path) for path in paths)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    digests = done.stdout.split()
    if done.returncode != 0 or len(digests) != len(paths):
        why = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        raise OSError(f"hashing the files failed: {why[0]}")
    return digests


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


if __name__ == "__main__":  # python -m ragserve.digests NICE PATH...: one digest a line (_in_child)
    os.nice(int(sys.argv[1]))
    for name in sys.argv[2:]:
        print(sha256_file(Path(name)), flush=True)
