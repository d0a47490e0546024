"""The indexer's share of the host: always at a lower priority, its threads measured at start (every
CPU when idle, fewer beside other work) and re-read while a build runs; flags pin either."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from indexer import host_share
from indexer.host_share import DEFAULT_NICE, decide
from ragserve.generate.host_share import EngineThreads

PROBE = (
    "import os, sys; from indexer.host_share import share_host; "
    "nice = None if sys.argv[1] == 'auto' else int(sys.argv[1]); "
    "n = share_host(nice, int(sys.argv[2]), neighbour=float(sys.argv[3])); "
    "print(n, os.getpriority(os.PRIO_PROCESS, 0), os.environ['OMP_NUM_THREADS'])"
)


def _probe(nice: str, threads: int, neighbour: float, env: dict[str, str] | None = None) -> list[int]:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, nice, str(threads), str(neighbour)],
        capture_output=True,
        text=True,
        check=True,
        env={**clean, **(env or {})},
    )
    return [int(v) for v in out.stdout.split()]


@pytest.mark.parametrize(
    ("cpus", "neighbour", "expected"),
    [
        (2, 0.0, (DEFAULT_NICE, 2)),  # idle: every CPU, at the lower priority (free when alone)
        (2, 0.2, (DEFAULT_NICE, 2)),  # a sidecar answering, or an idle one: the same
        (2, 0.7, (DEFAULT_NICE, 1)),  # a core's worth taken: one thread fewer
        (2, 2.0, (DEFAULT_NICE, 1)),  # never fewer than one
        (16, 3.5, (DEFAULT_NICE, 13)),  # 3.5 busy: three and a half cores, three taken
        (4, None, (DEFAULT_NICE, 3)),  # unreadable: as if a server ran beside it
    ],
)
def test_measured_share(cpus: int, neighbour: float | None, expected: tuple[int, int]) -> None:
    assert decide(cpus, neighbour, None, 0) == expected


def test_flags_pin_the_share() -> None:
    assert decide(2, 0.0, 10, 0) == (10, 2)  # --nice 10 on an idle host
    assert decide(2, 1.5, 0, 0) == (0, 1)  # --nice 0 beside a busy neighbour: threads still measured
    assert decide(2, 1.5, None, 2) == (DEFAULT_NICE, 2)  # --threads 2


def test_the_process_takes_its_share() -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    cpus = len(os.sched_getaffinity(0))
    assert _probe("auto", 0, 0.0) == [cpus, min(19, base + DEFAULT_NICE), cpus]
    threads, niceness, omp = _probe("auto", 0, cpus + 1.0)
    assert threads == omp == 1 and niceness == min(19, base + DEFAULT_NICE)
    assert _probe("0", 3, 5.0) == [3, base, 3]
    assert _probe("0", 1, 0.0, {"OMP_NUM_THREADS": "2"})[2] == 2  # the operator's variable is left alone


def test_the_watch_follows_a_neighbour() -> None:
    share = host_share._Share(2, EngineThreads(2))
    host_share.step(share, 0.1)
    assert share.threads.wanted == 2
    host_share.step(share, 1.0)  # a server starts answering: a thread fewer at once
    assert share.threads.wanted == 1
    for _ in range(3):  # it stops: the thread comes back after agreeing samples
        host_share.step(share, 0.0)
    assert share.threads.wanted == 2


def test_a_pinned_thread_count_is_kept_by_the_watch() -> None:
    share = host_share._Share(2, EngineThreads(2, fixed=2))
    host_share.step(share, 2.0)
    assert share.threads.wanted == 2
