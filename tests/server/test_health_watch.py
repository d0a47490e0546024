"""The generator health watcher: a probe that never answers must not hold health SERVING."""

from __future__ import annotations

import asyncio

from grpc_health.v1 import health_pb2

from ragserve.config import ObservabilitySettings, Settings
from ragserve.server.app import RagServer
from tests.fakes import FakeHangingHealthGenerator


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
