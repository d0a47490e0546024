"""The real gRPC servicer on a loopback port, in this process, without the generator (for the cache
and limit tests). It lives with the benchmarks, which use it too; kept under this name for the tests."""

from __future__ import annotations

from benchmarks.workloads import serve_pipeline as serve_pipeline
