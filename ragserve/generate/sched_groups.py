"""Which niced processes take CPU from this server, and which the scheduler puts behind it.

Linux shares the CPUs between scheduling groups first (cpu cgroups; within the root cgroup, one
autogroup per session when /proc/sys/kernel/sched_autogroup_enabled is 1), by the groups' weights,
and only then between one group's processes by their nice. So:

- a nice-19 job in the server's own group (started from the same shell, the same service) gets
  about 1.5% of a core the engine wants: it yields at once, and the engine keeps its threads;
- a nice-19 build started from another session (its own autogroup: a CI agent, another terminal,
  cron) or run as another service (its own cgroup) takes its group's full share beside the server,
  nice or not (BENCHMARKS.md, "A C++ build at nice 19 beside the server").

Where the reading is unclear (a group unreadable, another cgroup, another autogroup) a niced
process counts in full: a thread given away for nothing costs a share of a first token, a team of
threads kept beside a real competitor costs seconds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# The kernel's weight per nice level, -20..19 (kernel/sched/core.c, sched_prio_to_weight).
_WEIGHTS = (
    88761, 71755, 56483, 46273, 36291, 29154, 23254, 18705, 14949, 11916,
    9548, 7620, 6100, 4904, 3906, 3121, 2501, 1991, 1586, 1277,
    1024, 820, 655, 526, 423, 335, 272, 215, 172, 137,
    110, 87, 70, 56, 45, 36, 29, 23, 18, 15,
)  # fmt: skip


def nice_weight(nice: int) -> int:
    return _WEIGHTS[max(-20, min(19, nice)) + 20]


def contention_factor(their_nice: int, our_nice: int) -> float:
    """How much of a process's CPU time, in the server's own scheduling group, takes a core from
    the server: 1 at the server's nice or below (a peer); above it, what the scheduler would give
    it against one of the server's threads, over what it gives a peer (nice 10: 0.19, 19: 0.03)."""
    if their_nice <= our_nice:
        return 1.0
    ratio = nice_weight(their_nice) / nice_weight(our_nice)
    return 2.0 * ratio / (1.0 + ratio)


@dataclass(frozen=True, slots=True)
class SchedGroup:
    """Where the scheduler puts a process: its cpu cgroup and, when autogroups are on, its autogroup."""

    cpu_cgroup: str
    autogroup: str  # "/autogroup-152"; "" when autogroups are off


@dataclass(frozen=True, slots=True)
class ProcessTimes:
    parent: int
    nice: int
    cpu_seconds: float  # user + system
    started: int  # clock ticks after boot: with the pid, one process even when pids are reused


class ProcFs:
    """The few /proc files the classification reads; `root` points elsewhere in tests."""

    def __init__(self, root: Path = Path("/proc")) -> None:
        self.root = root
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def autogroups_on(self) -> bool:
        try:
            return (self.root / "sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
        except OSError:
            return False

    def processes(self) -> dict[int, ProcessTimes]:
        """Every process's parent, nice and CPU seconds (those that end meanwhile are left out)."""
        found: dict[int, ProcessTimes] = {}
        try:
            entries = [e.name for e in os.scandir(self.root) if e.name.isdigit()]
        except OSError:
            return found
        for name in entries:
            times = self.times(int(name))
            if times is not None:
                found[int(name)] = times
        return found

    def times(self, pid: int) -> ProcessTimes | None:
        try:
            text = (self.root / str(pid) / "stat").read_bytes()
            # Fields after the command's closing parenthesis, from the state (field 3) on.
            fields = text.rpartition(b")")[2].split()
            return ProcessTimes(
                int(fields[1]), int(fields[16]), (int(fields[11]) + int(fields[12])) / self._tick, int(fields[19])
            )
        except (OSError, ValueError, IndexError):
            return None

    def group(self, pid: int, autogroups: bool) -> SchedGroup | None:
        """None when unreadable (the process ended, or no permission)."""
        try:
            cgroup = _cpu_cgroup((self.root / str(pid) / "cgroup").read_text())
            autogroup = ""
            if autogroups:
                # "/autogroup-152 nice 0": the group's name, then the group's own nice. The file is
                # empty for a process in the root autogroup (no session was started between init
                # and it: a container's or a CI runner's processes); "" names that group.
                words = (self.root / str(pid) / "autogroup").read_text().split()
                autogroup = words[0] if words else ""
        except OSError:
            return None
        return None if cgroup is None else SchedGroup(cgroup, autogroup)


def _cpu_cgroup(text: str) -> str | None:
    """The path of the cgroup that shares CPU time: cgroup v1's cpu controller, else v2's one tree."""
    unified = None
    for line in text.splitlines():
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if "cpu" in controllers.split(","):
            return path
        if controllers == "":
            unified = path
    return unified


class NicedTime:
    """CPU seconds, since the previous reading, that other processes spent and the scheduler would
    have handed to this server had it wanted them: niced processes in its own scheduling group,
    weighted by how little they take from it (`contention_factor`). This process and the processes
    it started are left out (their time is the server's own)."""

    def __init__(self, proc: ProcFs | None = None, own_pid: int | None = None) -> None:
        self._proc = proc or ProcFs()
        self._own_pid = own_pid or os.getpid()
        self._last: dict[tuple[int, int], float] = {}
        self.processes = 0  # niced processes found yielding at the last reading

    def read(self) -> float:
        processes = self._proc.processes()
        ours = processes.get(self._own_pid)
        autogroups = self._proc.autogroups_on()
        own_group = self._proc.group(self._own_pid, autogroups)
        last, self._last = self._last, {}
        yielding, count = 0.0, 0
        if ours is None or own_group is None:
            return 0.0
        own_tree = _descendants(self._own_pid, processes)
        for pid, times in processes.items():
            if pid in own_tree:
                continue
            key = (pid, times.started)
            self._last[key] = times.cpu_seconds
            # A process not seen at the previous reading started since: all of its time is new.
            used = times.cpu_seconds - last.get(key, 0.0)
            if times.nice <= ours.nice or used <= 0.0 or self._proc.group(pid, autogroups) != own_group:
                continue
            yielding += used * (1.0 - contention_factor(times.nice, ours.nice))
            count += 1
        self.processes = count
        return yielding


def _descendants(root: int, processes: dict[int, ProcessTimes]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, times in processes.items():
        children.setdefault(times.parent, []).append(pid)
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found
