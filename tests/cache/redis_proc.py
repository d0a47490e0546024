"""A real redis-server started by the test on a free loopback port (never a system Redis). It lives
with the benchmarks, which use it too; kept under this name for the tests."""

from __future__ import annotations

from benchmarks.workloads import RedisProcess as RedisProcess
