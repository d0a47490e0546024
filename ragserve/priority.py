"""Work that shares the host with requests, run at a lower CPU priority: a hot reload's graph load,
in its helper process (a reload's hashing runs in a child process of its own: digests.py). Linux
gives each thread its own nice value, so the work runs on a fresh thread whose value is raised;
elsewhere it runs on a plain thread."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# How much lower than requests; a thread at +10 gets about a tenth of a core that requests want.
BACKGROUND_NICE = 10


def _lower_this_thread(nice: int) -> None:
    try:
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + nice))
    except (AttributeError, OSError):  # no per-thread priority here: run at the caller's
        pass


def at_lower_priority(work: Callable[[], T], nice: int = BACKGROUND_NICE) -> T:
    """`work()`'s result (or its exception), computed on a thread `nice` lower than the caller;
    `nice` <= 0 runs it here. Only in a process no request waits in (the graph helper): a
    low-priority thread holding the GIL would hold up the requests waiting for it."""
    if nice <= 0:
        return work()
    results: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            results.append(work())
        except BaseException as exc:
            failed.append(exc)

    start_at_lower_priority(run, nice).join()
    if failed:
        raise failed[0]
    return results[0]


def start_at_lower_priority(work: Callable[[], None], nice: int = BACKGROUND_NICE) -> threading.Thread:
    """A daemon thread running `work()` `nice` lower than the caller (as `at_lower_priority`, without
    waiting for it)."""

    def run() -> None:
        if nice > 0:
            _lower_this_thread(nice)
        work()

    worker = threading.Thread(target=run, name="background-work", daemon=True)
    worker.start()
    return worker
