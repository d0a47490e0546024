"""The indexer and tuners run beside a serving sidecar: lower CPU priority and fewer threads by
default, so a rebuild slows the server's answers in proportion to the CPU it takes, not at every
OpenMP barrier of the engine (BENCHMARKS.md, "A busy neighbour")."""

from __future__ import annotations

import logging
import os

from ragserve.generate.host import read_cpu_quota

log = logging.getLogger(__name__)

# Thread pools that read these when they start (torch/OpenMP, MKL, OpenBLAS, the Rust tokenizer's
# rayon pool that chunking's batches run on); ONNX Runtime gets the count through the embedder's settings.
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAYON_NUM_THREADS")

threads = 0  # the count chosen by `share_host` (0: not called; each library's own default)
DEFAULT_NICE = 10  # the indexer's default (--nice)


def usable_cpus() -> int:
    """CPUs this process may run on, or fewer under a container's CPU quota (cgroup v2 cpu.max)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = read_cpu_quota()
    return min(cpus, quota) if quota else cpus


def share_host(nice: int, thread_cap: int) -> int:
    """Raise this process's niceness by `nice` (0: unchanged) and cap its compute threads at
    `thread_cap` (0: every usable CPU but one, at least one). Before any model library loads."""
    global threads
    if nice > 0:
        try:
            os.nice(nice)
        except OSError as exc:  # a container may forbid it: go on at the inherited priority
            log.warning("could not lower the indexer's CPU priority (--nice %d): %s", nice, exc)
    threads = thread_cap or max(1, usable_cpus() - 1)
    for name in _THREAD_VARIABLES:
        os.environ.setdefault(name, str(threads))  # an explicit variable still wins
    return threads
