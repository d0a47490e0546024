"""The generator health watcher: a probe that never answers must not hold health SERVING; a
generation server that comes back gets the hot passages pre-filled again."""

from __future__ import annotations

import asyncio

from grpc_health.v1 import health_pb2

from ragserve.config import ObservabilitySettings, Settings
from ragserve.reports import GeneratorStatus, ReplicaState
from ragserve.server.app import RagServer
from tests.fakes import FakeGeneratorBase, FakeHangingHealthGenerator


def test_a_probe_that_never_answers_turns_health_not_serving() -> None:
    observability = ObservabilitySettings(health_probe_interval_s=0.02, health_probe_timeout_s=0.1, metrics_port=0)

    async def run() -> int:
        server = RagServer(Settings(observability=observability))  # grpc.aio wants a running loop
        await server.health.set("", health_pb2.HealthCheckResponse.SERVING)
        watcher = asyncio.ensure_future(server._watch_generator(FakeHangingHealthGenerator()))
        try:
            for _ in range(100):
                await asyncio.sleep(0.02)
                reply = await server.health.Check(health_pb2.HealthCheckRequest(service=""), None)
                if reply.status != health_pb2.HealthCheckResponse.SERVING:
                    break
            return int(reply.status)
        finally:
            watcher.cancel()

    assert asyncio.run(run()) == health_pb2.HealthCheckResponse.NOT_SERVING


class FakePoolGenerator(FakeGeneratorBase):
    """A pool of generation servers whose up/down states the test sets."""

    def __init__(self, up: dict[str, bool]) -> None:
        self.up = up

    def status(self) -> GeneratorStatus:
        return GeneratorStatus(False, tuple(ReplicaState(url, up, 0) for url, up in self.up.items()))


def test_a_generation_server_that_comes_back_gets_the_hot_passages_again() -> None:
    observability = ObservabilitySettings(health_probe_interval_s=0.01, health_probe_timeout_s=1.0, metrics_port=0)
    pool = FakePoolGenerator({"http://a": True, "http://b": False})
    rewarms: list[set[str]] = []

    async def rewarm() -> int:
        rewarms.append({url for url, up in pool.up.items() if up})
        return 1

    async def settle(rewarmed: int) -> None:
        for _ in range(500):  # until the watcher has seen it (a loaded host may be slow to run it)
            if len(rewarms) >= rewarmed:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # ten more probes: nothing more happens

    async def run() -> None:
        server = RagServer(Settings(observability=observability))
        watcher = asyncio.ensure_future(server._watch_generator(pool, rewarm=rewarm))
        try:
            await settle(0)
            assert rewarms == []  # what was up at start was warmed at start
            pool.up["http://b"] = True
            await settle(1)
            assert rewarms == [{"http://a", "http://b"}]  # once, however many probes see it up
            pool.up["http://a"] = False
            await settle(1)
            assert len(rewarms) == 1  # a server going away needs nothing
            pool.up["http://a"] = True
            await settle(2)
            assert len(rewarms) == 2
        finally:
            watcher.cancel()

    asyncio.run(run())


class FakeSurprisingHealthGenerator(FakeGeneratorBase):
    """A probe that raises what no probe should (a bug, or a peer's malformed answer), then recovers."""

    def __init__(self) -> None:
        self.probes = 0

    async def check_health(self) -> None:
        self.probes += 1
        if self.probes <= 3:
            raise TypeError("'int' object is not iterable")


def test_a_probe_that_raises_anything_fails_that_probe_and_the_watcher_goes_on() -> None:
    observability = ObservabilitySettings(health_probe_interval_s=0.01, health_probe_timeout_s=1.0, metrics_port=0)
    generator = FakeSurprisingHealthGenerator()

    async def run() -> list[int]:
        server = RagServer(Settings(observability=observability))
        await server.health.set("", health_pb2.HealthCheckResponse.SERVING)
        watcher = asyncio.ensure_future(server._watch_generator(generator))
        seen = []
        try:
            for _ in range(500):
                await asyncio.sleep(0.01)
                reply = await server.health.Check(health_pb2.HealthCheckRequest(service=""), None)
                if not seen or seen[-1] != reply.status:
                    seen.append(int(reply.status))
                if generator.probes > 5:
                    break
            assert not watcher.done()
            return seen
        finally:
            watcher.cancel()

    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    assert asyncio.run(run()) == [serving, not_serving, serving]
