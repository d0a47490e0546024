"""The sha256 of a file, read in blocks: every manifest (index versions, reader folders) lists one."""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_files(paths: list[Path], nice: int = 0) -> list[str]:
    """The digests of `paths`, in order, a file per core. With `nice` > 0 they are computed on one
    thread of that much lower CPU priority (Linux sets a nice value per thread; elsewhere it is a plain thread):
    hashlib lets go of the GIL over big blocks, so only the cores are shared, and requests get them first."""
    if nice <= 0:
        # Nothing else to share the cores with (a start-up): every core hashes, a file each.
        with ThreadPoolExecutor(max(1, min(len(paths), os.cpu_count() or 1))) as pool:
            return list(pool.map(sha256_file, paths))
    digests: list[str] = []
    failed: list[BaseException] = []

    def work() -> None:
        try:
            thread = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + nice))
        except (AttributeError, OSError):  # no per-thread priority here: hash at the caller's
            pass
        try:
            digests.extend(sha256_file(path) for path in paths)
        except BaseException as exc:
            failed.append(exc)

    worker = threading.Thread(target=work, name="verify-checksums", daemon=True)
    worker.start()
    worker.join()
    if failed:
        raise failed[0]
    return digests
