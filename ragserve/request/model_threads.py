"""Model threads that serve interactive work first.

Embedding, reranking and the prompt work run on a few threads (RAGSERVE_MODEL_THREADS). With
Python's ThreadPoolExecutor a burst of batch retrievals queued there would hold a person's query
behind it; this pool takes the class of the request that submitted each call (a context variable
the pipeline sets per request) and runs interactive calls first, each class in arrival order. A
call already running is never interrupted.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

from ragserve import metrics
from ragserve.retrieval_first import RetrievalFirst
from ragserve.types import RequestClass

P = ParamSpec("P")
T = TypeVar("T")

# The class of the request this task serves; set once per request by the pipeline.
CURRENT_CLASS: ContextVar[RequestClass] = ContextVar("request_class", default=RequestClass.INTERACTIVE)

_STOP_RANK = 1 << 30  # after every queued call: a worker stops once the work before it is done


class ClassedExecutor(Executor):
    def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self._max_workers = max_workers
        self._prefix = thread_name_prefix
        self._queue: queue.PriorityQueue[tuple[int, int, Any]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._shut_down = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        cls = CURRENT_CLASS.get()
        with self._lock:
            if self._shut_down:
                raise RuntimeError("cannot schedule new futures after shutdown")
            item = (future, fn, args, kwargs, cls, time.perf_counter())
            self._queue.put((cls.engine_priority, next(self._order), item))
            if not self._threads:  # started with the first call: a pool never used costs no threads
                for number in range(self._max_workers):
                    thread = threading.Thread(target=self._work, name=f"{self._prefix}_{number}", daemon=True)
                    self._threads.append(thread)
                    thread.start()
        return future

    def _work(self) -> None:
        while True:
            rank, _, item = self._queue.get()
            if rank == _STOP_RANK:
                return
            future, fn, args, kwargs, cls, submitted = item
            if future.set_running_or_notify_cancel():
                metrics.MODEL_QUEUE_MS.labels(cls.value).observe((time.perf_counter() - submitted) * 1000.0)
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # handed to the caller, as ThreadPoolExecutor does
                    future.set_exception(exc)
                else:
                    future.set_result(result)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shut_down = True
            threads = list(self._threads)
        if cancel_futures:
            kept = []
            while True:
                try:
                    entry = self._queue.get_nowait()
                except queue.Empty:
                    break
                if entry[0] == _STOP_RANK:
                    kept.append(entry)
                else:
                    entry[2][0].cancel()
            for entry in kept:
                self._queue.put(entry)
        for _ in threads:
            self._queue.put((_STOP_RANK, next(self._order), None))
        if wait:
            for thread in threads:
                thread.join()


class ModelThreads:
    """The one owner of the threads model work runs on, off the event loop: embedding and prompt
    work (`models`), reranking (`rerank`: it holds a thread for up to the whole budget, so the next
    request's embed never waits behind it; defaults to `models`) and a remote index's searches
    (`search`: a slow Qdrant never holds the embedding threads; None: searches run on `models`).
    `first`: the gate an in-process engine waits at while an interactive retrieval runs."""

    def __init__(
        self,
        models: Executor,
        rerank: Executor | None = None,
        search: Executor | None = None,
        first: RetrievalFirst | None = None,
    ) -> None:
        self.models = models
        self.rerank = rerank or models
        self.search = search
        self.first = first or RetrievalFirst(0.0)

    async def run(self, fn: Callable[[], T]) -> T:
        """`fn` on the model threads (the request's class decides its place in their queue)."""
        return await asyncio.get_running_loop().run_in_executor(self.models, fn)

    def shutdown(self) -> None:
        for executor in {e for e in (self.models, self.rerank, self.search) if e is not None}:
            executor.shutdown(wait=False, cancel_futures=True)
