"""The indexer beside a serving sidecar: lower CPU priority and a thread cap, by default."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = (
    "import os, sys; from indexer.host_share import share_host; "
    "n = share_host(int(sys.argv[1]), int(sys.argv[2])); "
    "print(n, os.getpriority(os.PRIO_PROCESS, 0), os.environ['OMP_NUM_THREADS'])"
)


def _probe(nice: int, threads: int, env: dict[str, str] | None = None) -> list[int]:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(nice), str(threads)],
        capture_output=True,
        text=True,
        check=True,
        env={**clean, **(env or {})},
    )
    return [int(v) for v in out.stdout.split()]


def test_defaults_leave_a_cpu_and_lower_the_priority() -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    cpus = len(os.sched_getaffinity(0))
    threads, niceness, omp = _probe(10, 0)
    assert threads == omp == max(1, cpus - 1)
    assert niceness == min(19, base + 10)


def test_explicit_settings_win() -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert _probe(0, 3) == [3, base, 3]
    # A thread variable set by the operator is left alone.
    assert _probe(0, 1, {"OMP_NUM_THREADS": "2"})[2] == 2
