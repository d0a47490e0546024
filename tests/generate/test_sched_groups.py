"""Which niced processes count as the engine's neighbours: read from fake /proc trees (files laid out
as the kernel's, written by the test: named fakes, not the kernel's own readings)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ragserve.generate.host_share import CpuCounters, NeighbourLoad
from ragserve.generate.sched_groups import NicedTime, ProcFs, contention_factor
from tests.generate.test_host_share import Clock, FakeProcStat

TICK = os.sysconf("SC_CLK_TCK")
SERVER = 100
V1_ROOT = "9:name=systemd:/\n4:memory:/process_api/abc\n1:cpu,cpuacct:/\n0::/\n"


class FakeProc:
    """A /proc tree with the files NicedTime reads: sys/kernel/sched_autogroup_enabled and, per
    process, stat, cgroup and autogroup."""

    def __init__(self, root: Path, autogroups: bool = True) -> None:
        self.root = root
        (root / "sys/kernel").mkdir(parents=True)
        (root / "sys/kernel/sched_autogroup_enabled").write_text("1\n" if autogroups else "0\n")
        self.seconds: dict[int, float] = {}

    def add(
        self,
        pid: int,
        nice: int = 0,
        parent: int = 1,
        autogroup: int | None = 7,
        cgroup: str = V1_ROOT,
        seconds: float = 0.0,
    ) -> None:
        """`autogroup=None`: the kernel's empty file for a process in the root autogroup."""
        folder = self.root / str(pid)
        folder.mkdir()
        (folder / "cgroup").write_text(cgroup)
        (folder / "autogroup").write_text("" if autogroup is None else f"/autogroup-{autogroup} nice 0\n")
        self._stat(pid, parent, nice, seconds)

    def run(self, pid: int, seconds: float) -> None:
        """The process used `seconds` more CPU time (user)."""
        stat = (self.root / str(pid) / "stat").read_text()
        fields = stat.rpartition(")")[2].split()
        self._stat(pid, int(fields[1]), int(fields[16]), self.seconds[pid] + seconds)

    def end(self, pid: int) -> None:
        for name in ("stat", "cgroup", "autogroup"):
            (self.root / str(pid) / name).unlink()
        (self.root / str(pid)).rmdir()

    def _stat(self, pid: int, parent: int, nice: int, seconds: float) -> None:
        self.seconds[pid] = seconds
        ticks = round(seconds * TICK)
        # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
        # cutime cstime priority nice num_threads itrealvalue starttime ...
        fields = [
            "S", parent, pid, pid, 0, -1, 0, 0, 0, 0, 0, ticks, 0, 0, 0, 20 + nice, nice, 1, 0, 1000 + pid, 0, 0,
        ]  # fmt: skip
        (self.root / str(pid) / "stat").write_text(f"{pid} (a name) with) spaces) " + " ".join(map(str, fields)))


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    fake = FakeProc(tmp_path / "proc")
    fake.add(SERVER, nice=0, autogroup=7)
    return fake


def niced_time(proc: FakeProc) -> NicedTime:
    niced = NicedTime(ProcFs(proc.root), own_pid=SERVER)
    assert niced.read() == 0.0  # the baseline
    return niced


def test_a_niced_job_in_the_servers_own_autogroup_yields(proc: FakeProc) -> None:
    proc.add(200, nice=19, autogroup=7)
    niced = niced_time(proc)
    proc.run(200, 1.0)
    assert niced.read() == pytest.approx(1.0 - contention_factor(19, 0))
    assert niced.processes == 1


def test_a_niced_job_in_another_autogroup_competes(proc: FakeProc) -> None:
    """A nice-19 build started from another session (setsid: a CI agent, another terminal)."""
    proc.add(300, nice=19, autogroup=8)
    niced = niced_time(proc)
    proc.run(300, 1.0)
    assert niced.read() == 0.0
    assert niced.processes == 0


def test_with_autogroups_off_the_autogroup_does_not_matter(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc", autogroups=False)
    proc.add(SERVER, autogroup=7)
    proc.add(300, nice=19, autogroup=8)
    niced = niced_time(proc)
    proc.run(300, 1.0)
    assert niced.read() == pytest.approx(1.0 - contention_factor(19, 0))


def test_a_niced_job_in_another_cpu_cgroup_competes(proc: FakeProc) -> None:
    """Another service (its own cgroup): groups share the CPUs by their weights, nice aside."""
    proc.add(400, nice=19, autogroup=7, cgroup="1:cpu,cpuacct:/system.slice/backup.service\n0::/\n")
    proc.add(401, nice=19, autogroup=7, cgroup="0::/system.slice/backup.service\n")
    niced = niced_time(proc)
    proc.run(400, 1.0)
    proc.run(401, 1.0)
    assert niced.read() == 0.0


def test_a_server_in_the_root_autogroup_shares_it_with_the_processes_there(tmp_path: Path) -> None:
    """No session started between init and the server (a container, a CI runner): the kernel
    leaves /proc/PID/autogroup empty, and that root group is a group like any other."""
    proc = FakeProc(tmp_path / "proc")
    proc.add(SERVER, autogroup=None)
    proc.add(410, nice=19, autogroup=None)  # a niced job in the root autogroup too
    proc.add(411, nice=19, autogroup=7)  # a niced job in a login session's autogroup
    niced = NicedTime(ProcFs(proc.root), SERVER)
    niced.read()
    proc.run(410, 1.0)
    proc.run(411, 1.0)
    assert niced.read() == pytest.approx(1.0 - contention_factor(19, 0))


def test_only_the_cpu_controllers_group_matters_in_cgroup_v1(proc: FakeProc) -> None:
    """A memory cgroup of its own (as every shell here has) does not separate CPU time."""
    proc.add(500, nice=19, autogroup=7, cgroup="4:memory:/process_api/other\n1:cpu,cpuacct:/\n0::/\n")
    niced = niced_time(proc)
    proc.run(500, 2.0)
    assert niced.read() == pytest.approx(2.0 * (1.0 - contention_factor(19, 0)))


def test_peers_and_the_servers_own_children_are_not_yielding_time(proc: FakeProc) -> None:
    proc.add(600, nice=0, autogroup=7)  # a peer at the server's nice: a full competitor
    proc.add(601, nice=19, parent=SERVER, autogroup=7)  # the server's own helper: its own time
    proc.add(602, nice=19, parent=601, autogroup=7)
    niced = niced_time(proc)
    for pid in (600, 601, 602):
        proc.run(pid, 1.0)
    assert niced.read() == 0.0


def test_a_process_started_since_the_last_reading_counts_all_its_time(proc: FakeProc) -> None:
    niced = niced_time(proc)
    proc.add(700, nice=19, autogroup=7, seconds=0.4)
    assert niced.read() == pytest.approx(0.4 * (1.0 - contention_factor(19, 0)))
    proc.run(700, 0.1)
    assert niced.read() == pytest.approx(0.1 * (1.0 - contention_factor(19, 0)))
    proc.end(700)
    assert niced.read() == 0.0


def test_an_unreadable_group_counts_as_a_competitor(proc: FakeProc) -> None:
    proc.add(800, nice=19, autogroup=7)
    niced = niced_time(proc)
    (proc.root / "800" / "cgroup").unlink()
    proc.run(800, 1.0)
    assert niced.read() == 0.0


def test_contention_grows_with_a_smaller_nice_difference() -> None:
    assert contention_factor(0, 0) == 1.0
    assert contention_factor(-5, 0) == 1.0
    assert contention_factor(19, 0) == pytest.approx(0.029, abs=0.002)
    assert contention_factor(10, 0) == pytest.approx(0.19, abs=0.01)
    assert contention_factor(1, 0) > 0.85
    assert contention_factor(19, 10) > contention_factor(19, 0)


def test_the_neighbour_load_leaves_out_niced_jobs_of_the_servers_own_group(proc: FakeProc, tmp_path: Path) -> None:
    """Two nice-19 jobs in the server's session keep both CPUs busy between answers: no neighbour;
    a nice-19 build from another session beside them: one CPU's worth."""
    stat = FakeProcStat(tmp_path / "stat", cpus=2)
    clock = Clock()
    proc.add(201, nice=19, autogroup=7)
    proc.add(202, nice=19, autogroup=7)
    load = NeighbourLoad(
        CpuCounters((0, 1), stat.path, own_seconds=lambda: 0.0), clock, NicedTime(ProcFs(proc.root), SERVER)
    )
    assert load.sample() is None
    clock.now += 1.0
    for cpu, pid in ((0, 201), (1, 202)):
        stat.add_niced_seconds(cpu, 1.0)
        proc.run(pid, 1.0)
    assert load.sample() == pytest.approx(2.0 * contention_factor(19, 0), abs=0.02)
    assert load.yielding_cpus == pytest.approx(2.0 * (1.0 - contention_factor(19, 0)), abs=0.02)
    proc.add(300, nice=19, autogroup=8)  # the build's compiler, started from another session
    clock.now += 1.0
    stat.add_niced_seconds(0, 1.0)
    stat.add_niced_seconds(1, 1.0)
    proc.run(300, 1.0)
    proc.run(201, 0.5)
    proc.run(202, 0.5)
    assert load.sample() == pytest.approx(1.0 + contention_factor(19, 0), abs=0.02)


def test_no_process_is_read_while_nothing_niced_runs(proc: FakeProc, tmp_path: Path) -> None:
    stat = FakeProcStat(tmp_path / "stat", cpus=2)
    clock = Clock()
    reads = []

    class CountingProcFs(ProcFs):
        def processes(self) -> dict[int, object]:  # type: ignore[override]
            reads.append(1)
            return super().processes()  # type: ignore[return-value]

    load = NeighbourLoad(
        CpuCounters((0, 1), stat.path, own_seconds=lambda: 0.0), clock, NicedTime(CountingProcFs(proc.root), SERVER)
    )
    load.sample()
    clock.now += 1.0
    stat.add_seconds(0, 1.0)
    assert load.sample() == pytest.approx(1.0, abs=0.02)
    assert len(reads) == 1  # the baseline only


def test_the_real_proc_reads_on_this_host() -> None:
    if not Path("/proc/self/stat").is_file():
        pytest.skip("no /proc here")
    proc = ProcFs()
    assert os.getpid() in proc.processes()
    assert proc.group(os.getpid(), proc.autogroups_on()) is not None
    niced = NicedTime()
    niced.read()
    assert niced.read() >= 0.0
