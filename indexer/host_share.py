"""The indexer's share of the host, decided by measurement: every usable CPU when nothing else keeps
them busy (a machine of its own, CI, a Kubernetes Job), fewer threads when a server or other work
runs beside it, always at a lower priority (BENCHMARKS.md, "A busy neighbour").
Others' load is read as the server's host share reads it (ragserve/generate/host_share.py: the
CPUs' counters less this process's own time), once at start and then while the build runs.
--threads and --nice pin either choice."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ragserve.generate.host import read_cpu_quota
from ragserve.generate.host_share import CpuCounters, EngineThreads, NeighbourLoad

log = logging.getLogger(__name__)

# Thread pools that read these when they start (torch/OpenMP, MKL, OpenBLAS, the Rust tokenizer's
# rayon pool that chunking's batches run on); ONNX Runtime gets the count through the embedder's settings.
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAYON_NUM_THREADS")

threads = 0  # the count chosen by `share_host` (0: not called; each library's own default)
# The priority unless --nice pins one. Always, not only once a neighbour is seen: alone it costs the
# build nothing, and a sidecar answering ten Retrieves a second reads as 0.13 to 0.23 CPUs on a Zen 5,
# within a tick or two of an idle host over the start's reading, so waiting to see it cost its p99
# (BENCHMARKS.md, "On a quiet Zen 5, the host").
DEFAULT_NICE = 10
MEASURE_S = 0.3  # the reading at start: long enough for the kernel's tick counters to move
WATCH_EVERY_S = 1.0

_state: _Share | None = None


class _Share:
    """What `share_host` chose, and what the watch changes while a build runs."""

    def __init__(self, cpus: int, threads: EngineThreads) -> None:
        self.cpus = cpus
        self.threads = threads


def usable_cpus() -> int:
    """CPUs this process may run on, or fewer under a container's CPU quota (cgroup v2 cpu.max)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = read_cpu_quota()
    return min(cpus, quota) if quota else cpus


def _neighbour_load() -> NeighbourLoad:
    cpus = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ()
    return NeighbourLoad(CpuCounters(cpus))


def measure_neighbour(window_s: float = MEASURE_S) -> float | None:
    """CPUs' worth of others' work on this process's CPUs over `window_s`; None when unreadable."""
    load = _neighbour_load()
    load.sample()
    time.sleep(window_s)
    return load.sample()


def decide(cpus: int, neighbour: float | None, nice: int | None, thread_cap: int) -> tuple[int, int]:
    """(niceness to add, threads): the flags when given; else DEFAULT_NICE, and every CPU on an idle
    host, one thread fewer per core others keep busy (the engine's rule). Unreadable load (no
    /proc/stat): one CPU fewer, as if a server ran beside it."""
    chosen_nice = DEFAULT_NICE if nice is None else nice
    if neighbour is None:
        return chosen_nice, thread_cap or max(1, cpus - 1)
    return chosen_nice, thread_cap or EngineThreads(cpus).update(neighbour)


def share_host(nice: int | None, thread_cap: int, neighbour: float | None = None, measure: bool = True) -> int:
    """Choose this process's priority and thread count (see `decide`; `nice`/`thread_cap` None/0:
    measured) and apply them before any model library loads; returns the thread count."""
    global threads, _state
    cpus = usable_cpus()
    if neighbour is None and measure and not thread_cap:
        neighbour = measure_neighbour()
    chosen_nice, threads = decide(cpus, neighbour, nice, thread_cap)
    if chosen_nice > 0:
        try:
            os.nice(chosen_nice)
        except OSError as exc:  # a container may forbid it: go on at the inherited priority
            log.warning("could not lower the indexer's CPU priority (--nice %d): %s", chosen_nice, exc)
    counts = EngineThreads(cpus, thread_cap)
    counts.wanted = threads
    _state = _Share(cpus, counts)
    for name in _THREAD_VARIABLES:
        os.environ.setdefault(name, str(threads))  # an explicit variable still wins
    log.info("indexer: %d of %d CPUs at nice +%d (others busy: %s CPUs)", threads, cpus, chosen_nice, neighbour)
    return threads


def wanted_threads() -> int:
    """Threads the build may use now (the watch lowers it while others are busy); 0 before `share_host`."""
    return _state.threads.wanted if _state is not None else threads


def most_threads() -> int:
    """The most threads the watch may give the build: every usable CPU, or --threads."""
    if _state is None:
        return threads
    return _state.threads.fixed or _state.cpus


def step(share: _Share, neighbour: float) -> None:
    """One reading while the build runs: threads follow others' load as the engine's do (fewer at
    once, more after agreeing samples)."""
    before = share.threads.wanted
    share.threads.update(neighbour)
    if share.threads.wanted != before:
        log.info("indexer threads %d -> %d: others keep %.1f CPUs busy", before, share.threads.wanted, neighbour)


@contextmanager
def watching(every_s: float = WATCH_EVERY_S) -> Iterator[None]:
    """Re-reads others' load on a daemon thread while the block runs (nothing to watch when
    --threads pinned the count, or before `share_host`)."""
    share = _state
    if share is None or share.threads.fixed or not Path("/proc/stat").exists():
        yield
        return
    stop = threading.Event()
    load = _neighbour_load()

    def run() -> None:
        load.sample()
        while not stop.wait(every_s):
            neighbour = load.sample()
            if neighbour is not None:
                step(share, neighbour)

    watch = threading.Thread(target=run, name="indexer-host-share", daemon=True)
    watch.start()
    try:
        yield
    finally:
        stop.set()
        watch.join()
