"""The neighbours' CPU share read from kernel counters, and the engine's thread count it decides."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from pathlib import Path

import pytest

from ragserve.generate.engine_thread import ThreadedEngine
from ragserve.generate.host import HostCpu, read_cpu_quota
from ragserve.generate.host_share import (
    SAMPLES_TO_GROW,
    CpuCounters,
    EngineThreads,
    HostShareWatch,
    NeighbourLoad,
)
from tests.fakes import FakeSyncEngine

TICK = os.sysconf("SC_CLK_TCK")


class FakeProcStat:
    """A /proc/stat file whose per-CPU busy ticks the test advances (named a fake: not the kernel's)."""

    def __init__(self, path: Path, cpus: int = 4) -> None:
        self.path = path
        self.busy = [0] * cpus
        self.niced = [0] * cpus
        self.write()

    def write(self) -> None:
        lines = ["cpu  1 2 3 4 5 6 7 8 0 0"]
        # user nice system idle iowait irq softirq steal guest guest_nice: busy split over the columns
        # that count (user, system, steal); idle and iowait never count.
        lines += [
            f"cpu{i} {b // 2} {n} {b // 4} 999 50 0 0 {b - b // 2 - b // 4} 0 0"
            for i, (b, n) in enumerate(zip(self.busy, self.niced, strict=True))
        ]
        self.path.write_text("\n".join(lines) + "\nintr 1 2 3\nctxt 5\n")

    def add_seconds(self, cpu: int, seconds: float) -> None:
        self.busy[cpu] += round(seconds * TICK)
        self.write()

    def add_niced_seconds(self, cpu: int, seconds: float) -> None:
        self.niced[cpu] += round(seconds * TICK)
        self.write()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.own = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_neighbours_share_is_busy_time_on_our_cpus_minus_our_own(tmp_path: Path) -> None:
    stat = FakeProcStat(tmp_path / "stat")
    clock = Clock()
    load = NeighbourLoad(CpuCounters((0, 1), stat.path, own_seconds=lambda: clock.own), clock)
    assert load.sample() is None  # the first reading is the baseline
    clock.now += 2.0
    stat.add_seconds(0, 2.0)  # CPU 0 fully busy, half of it ours
    stat.add_seconds(1, 1.0)
    stat.add_seconds(3, 2.0)  # not one of our CPUs: ignored
    clock.own += 1.0
    assert load.sample() == pytest.approx(1.0, abs=0.02)  # (3 s busy - 1 s ours) / 2 s
    clock.now += 1.0
    clock.own += 0.5
    stat.add_seconds(0, 0.5)  # all of the busy time was ours
    assert load.sample() == pytest.approx(0.0, abs=0.02)


def test_niced_neighbours_are_counted(tmp_path: Path) -> None:
    """Nice orders processes within one scheduling group only: a niced build in another session or
    service takes its full share, so its time counts as a neighbour's."""
    stat = FakeProcStat(tmp_path / "stat", cpus=2)
    clock = Clock()
    load = NeighbourLoad(CpuCounters((0, 1), stat.path, own_seconds=lambda: 0.0), clock)
    load.sample()
    clock.now += 1.0
    stat.add_niced_seconds(0, 1.0)
    assert load.sample() == pytest.approx(1.0, abs=0.02)


def test_a_missing_proc_stat_reports_nothing(tmp_path: Path) -> None:
    load = NeighbourLoad(CpuCounters((0,), tmp_path / "absent"))
    assert load.sample() is None
    assert load.sample() is None


def test_the_real_counters_read_on_this_host() -> None:
    if not Path("/proc/stat").is_file():
        pytest.skip("no /proc/stat here")
    load = NeighbourLoad(CpuCounters(tuple(sorted(os.sched_getaffinity(0)))))
    load.sample()
    time.sleep(0.05)
    share = load.sample()
    assert share is not None and 0.0 <= share <= len(os.sched_getaffinity(0)) + 0.5


def test_threads_drop_at_once_for_each_core_taken_and_come_back_slowly() -> None:
    threads = EngineThreads(cpus=4)
    assert threads.wanted == 4
    assert threads.update(0.3) == 4  # background noise takes no core
    assert threads.update(1.7) == 2  # a 2-thread neighbour: two fewer, at once
    assert threads.update(9.0) == 1  # never fewer than one
    for _ in range(SAMPLES_TO_GROW - 1):
        assert threads.update(0.0) == 1
    assert threads.update(0.0) == 2  # one back after enough quiet samples
    assert threads.update(2.0) == 2  # the neighbour is back: quiet samples counted again from zero
    for _ in range(SAMPLES_TO_GROW - 1):
        assert threads.update(0.0) == 2


def test_a_fixed_count_never_moves() -> None:
    threads = EngineThreads(cpus=2, fixed=2)
    assert not threads.adaptive
    assert threads.update(2.0) == 2
    assert threads.neighbour_cpus == 2.0  # still reported


def test_the_watch_updates_the_threads_from_its_own_thread(tmp_path: Path) -> None:
    stat = FakeProcStat(tmp_path / "stat", cpus=2)
    load = NeighbourLoad(CpuCounters((0, 1), stat.path, own_seconds=lambda: 0.0))
    watch = HostShareWatch(load, EngineThreads(cpus=2), every_s=0.02)
    watch.start()
    try:
        stop = threading.Event()

        def neighbour() -> None:  # keeps both CPUs busy, as the counters tell it
            while not stop.wait(0.01):
                stat.add_seconds(0, 0.01)
                stat.add_seconds(1, 0.01)

        busy = threading.Thread(target=neighbour)
        busy.start()
        try:
            # Read while the neighbour still runs: a sample after it stops sees no neighbour.
            deadline = time.monotonic() + 5
            state = watch.state()
            while state.engine_threads != 1 and time.monotonic() < deadline:
                time.sleep(0.01)
                state = watch.state()
        finally:
            stop.set()
            busy.join()
        assert state.engine_threads == 1 and state.adaptive and state.usable_cpus == 2
        assert state.neighbour_cpus > 0.6
    finally:
        watch.stop()


def test_the_engine_thread_calls_before_step_on_its_own_thread_before_every_step() -> None:
    fake = FakeSyncEngine(per_step=1)
    seen: list[str] = []
    engine = ThreadedEngine(lambda: fake, before_step=lambda: seen.append(threading.current_thread().name))
    engine.start()

    async def ask() -> None:
        async for _ in engine.generate("a b c", None, "r1"):
            pass

    try:
        asyncio.run(ask())
    finally:
        engine.shutdown()
    assert seen and set(seen) == {"vllm-engine"}
    assert len(seen) == fake.steps


def test_a_failing_sample_is_logged_and_the_engine_gets_every_thread_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The watch used to end silently on any exception, freezing the count (perhaps at one)."""
    stat = FakeProcStat(tmp_path / "stat", cpus=2)
    load = NeighbourLoad(CpuCounters((0, 1), stat.path, own_seconds=lambda: 0.0))
    threads = EngineThreads(cpus=2)
    threads.wanted = 1  # a neighbour had taken a core
    watch = HostShareWatch(load, threads, every_s=0.02)
    watch.start()
    try:
        with caplog.at_level(logging.ERROR):
            stat.path.write_text("cpu0 not numbers at all\ncpu1 x\n")  # the next samples raise
            deadline = time.monotonic() + 5
            while threads.wanted != 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert threads.wanted == 2 and "a sample failed" in caplog.text
            stat.write()  # readable again: the watch still runs and samples
            stat.add_seconds(0, 50.0)
            stat.add_seconds(1, 50.0)
            deadline = time.monotonic() + 5
            while threads.wanted != 1 and time.monotonic() < deadline:
                stat.add_seconds(0, 1.0)
                stat.add_seconds(1, 1.0)
                time.sleep(0.01)
            assert threads.wanted == 1
    finally:
        watch.stop()


@pytest.mark.parametrize(
    ("text", "quota"), [("max 100000\n", None), ("150000 100000\n", 2), ("50000 100000", 1), ("garbage", None)]
)
def test_the_containers_cpu_quota_bounds_the_usable_cpus(tmp_path: Path, text: str, quota: int | None) -> None:
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text(text)
    no_v1 = tmp_path / "no-cgroup"
    assert read_cpu_quota(cpu_max, no_v1) == quota
    host = HostCpu("CPU", frozenset(), tuple(range(64)), read_cpu_quota(cpu_max, no_v1))
    assert host.usable == (quota or 64) and len(host.usable_cpus) == host.usable
    assert read_cpu_quota(tmp_path / "missing", no_v1) is None


@pytest.mark.parametrize(("quota", "cpus"), [("-1", None), ("100000", 1), ("150000", 2)])
def test_a_cgroup_v1_quota_bounds_the_usable_cpus_too(tmp_path: Path, quota: str, cpus: int | None) -> None:
    own = tmp_path / "self-cgroup"
    own.write_text("4:memory:/pod\n3:cpu,cpuacct:/pod/sidecar\n0::/\n")
    group = tmp_path / "root" / "cpu,cpuacct" / "pod" / "sidecar"
    group.mkdir(parents=True)
    (group / "cpu.cfs_quota_us").write_text(quota + "\n")
    (group / "cpu.cfs_period_us").write_text("100000\n")
    assert read_cpu_quota(tmp_path / "no-cpu.max", own, tmp_path / "root") == cpus
    # Both kinds present: the tighter one holds.
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("300000 100000")
    assert read_cpu_quota(cpu_max, own, tmp_path / "root") == (cpus or 3)


def test_the_sidecars_own_child_processes_are_no_neighbour() -> None:
    """A child busy on the CPU (as a big version's graph helper is) counts as the server's own
    time, running and after it ended; this thread meanwhile only waits."""
    import subprocess
    import sys

    from ragserve.generate.host_share import own_cpu_seconds

    before = own_cpu_seconds()
    spin = "import sys, time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\n"
    wait = "print('spun', flush=True)\nsys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", spin + wait], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"spun\n"  # 0.4 s of CPU spent
    running = own_cpu_seconds() - before
    child.communicate(b"", timeout=10)
    ended = own_cpu_seconds() - before
    assert running >= 0.35 and ended >= running - 0.05


def test_a_containers_own_v1_group_is_found_at_the_mount(tmp_path: Path) -> None:
    """Inside a container /proc/self/cgroup names the host's path; the mount holds the container's group."""
    own = tmp_path / "self-cgroup"
    own.write_text("3:cpu,cpuacct:/docker/abc123\n")
    mount = tmp_path / "root" / "cpu"
    mount.mkdir(parents=True)
    (mount / "cpu.cfs_quota_us").write_text("200000\n")
    (mount / "cpu.cfs_period_us").write_text("100000\n")
    assert read_cpu_quota(tmp_path / "no-cpu.max", own, tmp_path / "root") == 2
