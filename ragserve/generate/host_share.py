"""The engine's share of a host it shares: how much of its CPUs something else keeps busy, how many
threads the engine runs (HostShareWatch), and whether its decode keeps its pace alone (HostSharePace).
The indexer's side of the same share is indexer/host_share.py.

The engine's OpenMP team meets at a barrier in every layer. When a neighbour (the app next door, an
indexer) takes a core, one thread of the team waits for the scheduler while the others spin at the
barrier, and a step takes many times longer than the CPU it lost (BENCHMARKS.md, "A busy
neighbour"). With one thread fewer per core the neighbour keeps busy, the team never waits on a
thread that is not running, and answers slow in proportion to the CPU taken.

The neighbour's share is read from the kernel's per-CPU counters (/proc/stat) for the CPUs this
process may run on, minus the CPU time of this process and the processes it started (a big
version's graph helper, an engine's own processes): steal time (another VM on the same cores)
counts as a neighbour too. Niced processes count where the scheduler would not put them behind the
server (generate/sched_groups.py): nice orders processes only within one scheduling group, so a
niced job started from another session (autogroups: a CI agent, a build in another terminal, cron)
or run as another service (its own cgroup) takes its full share beside the server, while one in
the server's own group yields at once. A C++ build at nice 19 in its own session took first tokens
to seconds while the engine kept both threads; counting every niced job cost first tokens 1.4-1.5x
at p95 beside two nice-19 jobs of the server's own session, which give their cores back anyway
(BENCHMARKS.md, "A C++ build at nice 19 beside the server", "Niced jobs in the server's own group").
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from ragserve import metrics
from ragserve.generate.base import Generator
from ragserve.generate.sched_groups import NicedTime
from ragserve.prompt import build_prompt
from ragserve.reports import HostShareState
from ragserve.types import GenerateParams

log = logging.getLogger(__name__)

# /proc/stat per-CPU columns: user nice system idle iowait irq softirq steal (guest time is in user).
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)
# A neighbour counts as taking a core from this share of one up (0.6 of a core busy: one thread fewer).
TAKES_A_CORE_FROM = 0.6
SAMPLE_EVERY_S = 0.5
# Consecutive samples that must agree before the engine gets a thread back (it gives one up at once:
# a late step costs far more than a slow one).
SAMPLES_TO_GROW = 3
# Niced user time (the nice column, seconds per sample) below which no process is looked at: the
# per-process scan is left out while no niced process runs.
NICED_FROM_S = 0.01


class CpuCounters:
    """Busy seconds of a set of CPUs (every process, niced ones too), of this process, and the niced
    processes' user time on those CPUs, read together."""

    def __init__(
        self,
        cpus: tuple[int, ...],
        stat_path: Path = Path("/proc/stat"),
        own_seconds: Callable[[], float] | None = None,
    ) -> None:
        self._names = {f"cpu{cpu}" for cpu in cpus}
        self._stat_path = stat_path
        self._own_seconds = own_seconds or own_cpu_seconds
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def read(self) -> tuple[float, float, float] | None:
        """(busy seconds of the CPUs, this process's CPU seconds, niced user seconds of the CPUs);
        None where /proc/stat is missing."""
        try:
            lines = self._stat_path.read_text().splitlines()
        except OSError:
            return None
        busy = niced = 0
        for line in lines:
            name, _, rest = line.partition(" ")
            if name in self._names:
                columns = rest.split()
                busy += sum(int(columns[i]) for i in _BUSY_COLUMNS if i < len(columns))
                niced += int(columns[1]) if len(columns) > 1 else 0
        return busy / self._tick, self._own_seconds(), niced / self._tick


def own_cpu_seconds() -> float:
    """CPU seconds of this process and of every process it started, running or ended: the
    sidecar's own helpers (a big version's graph process, an engine's processes) are no neighbour."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system + _running_children_seconds()


def _running_children_seconds() -> float:
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total, todo, seen = 0, [os.getpid()], set()
    while todo:
        pid = todo.pop()
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split() if int(c) not in seen]
            if pid != os.getpid():
                # Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
                fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
                total += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile (its time is in the children's counters once reaped)
        seen.add(pid)
    return total / tick


class NeighbourLoad:
    """CPUs' worth of time others used on this process's CPUs between two samples. `niced`: how
    niced processes the scheduler puts behind this one are told apart (None: every niced process
    counts, as it does for a reader that cannot tell)."""

    def __init__(
        self,
        counters: CpuCounters,
        clock: Callable[[], float] = time.monotonic,
        niced: NicedTime | None = None,
    ) -> None:
        self._counters = counters
        self._clock = clock
        self._niced = niced
        self._last: tuple[float, float, float, float] | None = None
        self.yielding_cpus = 0.0  # niced processes' CPUs left out of the last sample: they yield

    def sample(self) -> float | None:
        """Others' busy CPUs since the previous sample (None on the first, or unreadable)."""
        reading = self._counters.read()
        if reading is None:
            return None
        now = self._clock()
        last, self._last = self._last, (now, *reading)
        if last is None or now <= last[0]:
            if self._niced is not None:
                self._niced.read()  # the baseline of every process's time
            return None
        busy = reading[0] - last[1]
        own = reading[1] - last[2]
        yielding = 0.0
        if self._niced is not None and reading[2] - last[3] >= NICED_FROM_S:
            yielding = self._niced.read()
        others = max(0.0, busy - own)
        self.yielding_cpus = min(yielding, others) / (now - last[0])
        return max(0.0, others - yielding) / (now - last[0])


class EngineThreads:
    """Threads for the engine's next step: every usable CPU when nothing else uses them, one fewer
    per core a neighbour keeps busy, never fewer than one. `fixed` > 0 pins the count."""

    def __init__(self, cpus: int, fixed: int = 0) -> None:
        self.cpus = cpus
        self.fixed = fixed
        self.wanted = fixed or cpus
        self.neighbour_cpus = 0.0
        self._grow_votes = 0

    @property
    def adaptive(self) -> bool:
        return not self.fixed

    def update(self, neighbour_cpus: float) -> int:
        self.neighbour_cpus = neighbour_cpus
        if self.fixed:
            return self.wanted
        taken = int(neighbour_cpus + (1.0 - TAKES_A_CORE_FROM))
        target = max(1, self.cpus - taken)
        if target < self.wanted:
            self.wanted, self._grow_votes = target, 0
        elif target > self.wanted:
            self._grow_votes += 1
            if self._grow_votes >= SAMPLES_TO_GROW:
                self.wanted, self._grow_votes = self.wanted + 1, 0
        else:
            self._grow_votes = 0
        return self.wanted


class HostShareWatch:
    """Samples the neighbours' load on a daemon thread and keeps `threads` up to date."""

    def __init__(self, load: NeighbourLoad, threads: EngineThreads, every_s: float = SAMPLE_EVERY_S) -> None:
        self._load = load
        self.threads = threads
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-share-watch", daemon=True)

    def start(self) -> None:
        self._load.sample()  # the first reading is the baseline
        self._thread.start()

    def state(self) -> HostShareState:
        t = self.threads
        return HostShareState(t.cpus, t.neighbour_cpus, t.wanted, t.adaptive)

    def _run(self) -> None:
        failed = ""
        while not self._stop.wait(self._every_s):
            try:
                self._sample()
                failed = ""
            except Exception as exc:  # never end silently with the count frozen (perhaps at one)
                if failed != repr(exc):
                    log.exception("host share watch: a sample failed; the engine keeps every thread meanwhile")
                failed = repr(exc)
                self.threads.wanted = self.threads.fixed or self.threads.cpus
                metrics.GENERATOR_THREADS.set(self.threads.wanted)

    def _sample(self) -> None:
        neighbour = self._load.sample()
        if neighbour is not None:
            before = self.threads.wanted
            wanted = self.threads.update(neighbour)
            metrics.HOST_NEIGHBOUR_CPUS.set(neighbour)
            metrics.GENERATOR_THREADS.set(wanted)
            if wanted != before:
                log.info(
                    "engine threads %d -> %d: other processes keep %.1f of this server's %d CPUs busy "
                    "(not counted: %.1f of niced processes in its own scheduling group, which yield to it)",
                    before, wanted, neighbour, self.threads.cpus, self._load.yielding_cpus,
                )  # fmt: skip

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self._every_s)


# Speculation makes single answers vary by up to ~2x in ms/token; a neighbour taking a core from a
# 2-thread engine made it 2.4-4.2x (BENCHMARKS.md, "A busy neighbour"): flagged from 2.5x.
CONTENDED_RATIO = 2.5
_WINDOW = 16
_BASELINE_PROMPT = build_prompt("List the numbers from one to twenty.", [])
_BASELINE_TOKENS = 24


class HostSharePace:
    """Is the engine running at this host's pace? A busy neighbour shows as decode steps far slower
    than the same engine measured alone at start-up: the baseline is the time per output token of a
    fixed prompt right after start; every answer that had the engine to itself adds its time per
    output token to a window (answers that shared it are left out: batching slows steps by design),
    and the window's median over the baseline is the pace ratio."""

    def __init__(self) -> None:
        self.baseline_ms: float | None = None
        self._recent: deque[float] = deque(maxlen=_WINDOW)

    async def measure_baseline(self, generator: Generator) -> None:
        """Time per output token of a fixed prompt, on the idle engine (after its warm-up)."""
        first: float | None = None
        tokens = 0
        async for chunk in generator.stream(_BASELINE_PROMPT, GenerateParams(_BASELINE_TOKENS, 0.0), "pace-baseline"):
            if chunk.text and first is None:
                first = time.perf_counter()
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        if first is not None and tokens > 1:
            self.baseline_ms = (time.perf_counter() - first) * 1000.0 / (tokens - 1)

    def record(self, time_per_output_token_ms: float, had_engine_alone: bool) -> None:
        if had_engine_alone and time_per_output_token_ms > 0:
            self._recent.append(time_per_output_token_ms)
            ratio = self.ratio()
            if ratio is not None:
                metrics.GENERATOR_PACE_RATIO.set(ratio)

    def ratio(self) -> float | None:
        """Recent ms/token over the start-up baseline (None until both are known)."""
        if self.baseline_ms is None or len(self._recent) < 3:
            return None
        return statistics.median(self._recent) / self.baseline_ms

    def describe(self, share: HostShareState | None = None) -> str:
        """For Info: the pace and whether the host looks contended. `share`: what other processes
        take of the engine's CPUs; an engine that gave them threads keeps its pace per thread, so
        the pace alone would say "normal" beside a busy neighbour."""
        ratio = self.ratio()
        # Only a count that follows the neighbours says one is there (a fixed count is a choice).
        gave_way = share is not None and share.adaptive and share.engine_threads < share.usable_cpus
        if ratio is None and not gave_way:
            return "not measured yet"
        if ratio is not None and ratio >= CONTENDED_RATIO:
            state = "contended: something else is using this engine's CPUs"
        elif gave_way:
            assert share is not None
            state = (
                f"contended: other processes keep {share.neighbour_cpus:.1f} of this server's "
                f"{share.usable_cpus} CPUs busy; the engine runs {share.engine_threads} thread(s)"
            )
        else:
            state = "normal"
        if ratio is None:
            return state
        return f"{state} (decode {ratio:.1f}x its pace alone, {self.baseline_ms:.1f} ms/token)"
