"""Stalls of the machine under this one, seen by a process that does nothing but read memory.

On a virtual machine, the host can slow every access to the guest's memory for a while (on the
two-vCPU guests of BENCHMARKS.md, "Reloads and the host's stalls": some 90 ms for what takes 1 ms),
which the guest counts as its own CPU time, not as steal. A request that overlaps such a stall is
slow whatever the server does. This probe, a process apart from the server, times a fixed set of
random reads from 512 MiB every 10 ms; a read set whose CPU time is far over its median marks a
stall. Benchmarks report their percentiles with and without the requests that overlap one.

    python benchmarks/host_stalls.py OUT   (the probe itself; HostStallProbe starts and stops it)
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import numpy as np

PROBE_MIB = 512
READS = 4000  # random 8-byte reads per timed set: some 4,000 pages touched
PERIOD_S = 0.01
# A set is a stall when its CPU time is over both of these (its median is some 0.1 to 0.3 ms).
STALL_FACTOR = 10.0
STALL_MIN_MS = 3.0
SETTLING_SETS = 10  # the first sets fault the probe's own pages in
# A stall reaches processes up to some 0.3 s apart, and reads stay slow for some 0.25 s after its
# onset (a probe in C beside this one, BENCHMARKS.md): a request this near a stalled set is in it.
REACH_S = 0.3


def probe(out: Path) -> None:
    rng = np.random.default_rng(0)
    memory = rng.integers(0, 2**63, size=PROBE_MIB << 17, dtype=np.uint64)
    picks = [rng.integers(0, memory.size, size=READS) for _ in range(64)]
    with out.open("w", buffering=1) as log:
        for n in range(sys.maxsize):
            wall, cpu = time.time(), time.thread_time()
            memory[picks[n % len(picks)]].sum()
            log.write(f"{wall:.4f} {(time.thread_time() - cpu) * 1000:.3f}\n")
            time.sleep(PERIOD_S)


class HostStallProbe:
    """The probe process for the duration of a `with` block; afterwards, its stalls."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.sets: list[tuple[float, float]] = []  # (start, CPU ms) of each timed read set
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> HostStallProbe:
        self.out.unlink(missing_ok=True)
        self._proc = subprocess.Popen([sys.executable, __file__, str(self.out)], stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not (self.out.exists() and self.out.stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.1)  # its memory is filled before the first set
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(10)
        lines = self.out.read_text().splitlines() if self.out.exists() else []
        self.sets = [(float(a), float(b)) for a, b in (line.split() for line in lines if len(line.split()) == 2)]

    def stalls(self) -> list[tuple[float, float]]:
        """(start, end) of each stalled read set."""
        sets = self.sets[SETTLING_SETS:]
        if not sets:
            return []
        bar = max(STALL_MIN_MS, STALL_FACTOR * float(np.median([ms for _, ms in sets])))
        return [(start, start + ms / 1000) for start, ms in sets if ms > bar]

    def overlapping(self, requests: list[tuple[float, float]]) -> list[bool]:
        """For each (start, ms) request, whether a stall (widened by REACH_S each side) overlapped it."""
        stalls = [(a - REACH_S, b + REACH_S) for a, b in self.stalls()]
        return [any(a < start + ms / 1000 and b > start for a, b in stalls) for start, ms in requests]


if __name__ == "__main__":
    probe(Path(sys.argv[1]))
