"""Model threads that run interactive calls before batch ones."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from concurrent.futures import CancelledError, Future

import pytest
from prometheus_client import REGISTRY

from ragserve.request.model_threads import CURRENT_CLASS, ClassedExecutor
from ragserve.types import RequestClass


def _submit_as(pool: ClassedExecutor, cls: RequestClass, fn: object) -> Future[object]:
    def submit() -> Future[object]:
        CURRENT_CLASS.set(cls)
        return pool.submit(fn)  # type: ignore[arg-type]

    return contextvars.copy_context().run(submit)


def test_queued_interactive_calls_run_before_queued_batch_ones() -> None:
    pool = ClassedExecutor(1, "test-model")
    release = threading.Event()
    order: list[str] = []
    try:
        busy = _submit_as(pool, RequestClass.BATCH, release.wait)
        queued = [
            _submit_as(pool, RequestClass.BATCH, lambda: order.append("batch-1")),
            _submit_as(pool, RequestClass.BATCH, lambda: order.append("batch-2")),
            _submit_as(pool, RequestClass.INTERACTIVE, lambda: order.append("person-1")),
            _submit_as(pool, RequestClass.INTERACTIVE, lambda: order.append("person-2")),
        ]
        release.set()
        for future in [busy, *queued]:
            future.result(timeout=5)
    finally:
        pool.shutdown()
    # The call already running finishes; then people first, each class in arrival order.
    assert order == ["person-1", "person-2", "batch-1", "batch-2"]


def test_the_wait_for_a_model_thread_is_measured_by_class() -> None:
    def count(cls: RequestClass) -> float:
        sample = REGISTRY.get_sample_value("ragserve_model_queue_wait_ms_count", {"request_class": cls.value})
        return sample or 0.0

    before = {cls: count(cls) for cls in RequestClass}
    pool = ClassedExecutor(1, "test-model")
    try:
        _submit_as(pool, RequestClass.BATCH, lambda: None).result(timeout=5)
        _submit_as(pool, RequestClass.INTERACTIVE, lambda: None).result(timeout=5)
        _submit_as(pool, RequestClass.INTERACTIVE, lambda: None).result(timeout=5)
    finally:
        pool.shutdown()
    assert count(RequestClass.BATCH) - before[RequestClass.BATCH] == 1
    assert count(RequestClass.INTERACTIVE) - before[RequestClass.INTERACTIVE] == 2


def test_results_and_errors_reach_the_caller_and_every_worker_runs() -> None:
    pool = ClassedExecutor(2, "test-model")
    names: set[str] = set()
    barrier = threading.Barrier(2, timeout=5)

    def meet() -> str:
        names.add(threading.current_thread().name)
        barrier.wait()  # both calls at once: two workers
        return "met"

    def fail() -> None:
        raise ValueError("model call failed")

    try:
        assert [f.result(timeout=5) for f in [pool.submit(meet), pool.submit(meet)]] == ["met", "met"]
        with pytest.raises(ValueError, match="model call failed"):
            pool.submit(fail).result(timeout=5)
    finally:
        pool.shutdown()
    assert names == {"test-model_0", "test-model_1"}


def test_the_class_of_the_asyncio_task_that_submits_is_the_one_used() -> None:
    pool = ClassedExecutor(1, "test-model")
    release = threading.Event()
    order: list[str] = []

    async def request(cls: RequestClass, name: str) -> None:
        CURRENT_CLASS.set(cls)  # as the pipeline does for each request's task
        await asyncio.get_running_loop().run_in_executor(pool, lambda: order.append(name))

    async def main() -> None:
        blocker = asyncio.get_running_loop().run_in_executor(pool, release.wait)
        batch = asyncio.create_task(request(RequestClass.BATCH, "batch"))
        await asyncio.sleep(0.05)
        person = asyncio.create_task(request(RequestClass.INTERACTIVE, "person"))
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.gather(blocker, batch, person)
        assert CURRENT_CLASS.get() is RequestClass.INTERACTIVE  # the tasks' settings stayed theirs

    try:
        asyncio.run(main())
    finally:
        pool.shutdown()
    assert order == ["person", "batch"]


def test_shutdown_cancels_queued_calls_when_asked_and_refuses_new_ones() -> None:
    pool = ClassedExecutor(1, "test-model")
    release = threading.Event()
    running = pool.submit(release.wait)
    queued = pool.submit(lambda: "never")
    releaser = threading.Timer(0.1, release.set)
    releaser.start()
    pool.shutdown(wait=True, cancel_futures=True)
    assert running.result(timeout=1) is True
    with pytest.raises(CancelledError):
        queued.result(timeout=1)
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(lambda: None)


def test_shutdown_without_cancelling_finishes_the_queued_calls() -> None:
    pool = ClassedExecutor(1, "test-model")
    done: list[int] = []
    futures = [pool.submit(done.append, i) for i in range(5)]
    pool.shutdown(wait=True)
    assert done == [0, 1, 2, 3, 4] and all(f.done() for f in futures)


def test_a_pool_never_used_starts_no_threads() -> None:
    before = threading.active_count()
    pool = ClassedExecutor(4, "test-model")
    assert threading.active_count() == before
    pool.shutdown()
