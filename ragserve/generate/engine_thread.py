"""vLLM's engine on one thread of the server process, with an async face like AsyncLLM's.

AsyncLLM always runs the engine core in a process of its own. On a CPU host with two cores that
process busy-polls beside the model's OpenMP threads, and with n-gram speculation (which turns off
vLLM's async scheduling) it lost most of speculation's gain there (BENCHMARKS.md, "Time to first
token and speculation"). This runs the synchronous
LLMEngine with its in-process core and uni executor on a dedicated thread:

- every engine call (add, abort, step) happens on that thread, since LLMEngine is not thread-safe,
  and the model's OpenMP team belongs to the thread that runs it;
- callers talk to it through a command queue; outputs come back to each caller's event loop;
- while the model runs, torch releases the GIL, so the event loop keeps serving; the engine's
  Python parts (scheduler, sampling, detokenizing) do share the GIL with it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ragserve.config import GeneratorSettings, default_of

log = logging.getLogger(__name__)


class EngineThreadDead(RuntimeError):
    """The engine thread stopped on an error; every request in flight gets it."""


class EngineStalled(RuntimeError):
    """One engine call has run far past any expected step time; unhealthy until it ends."""


class DuplicateRequestId(RuntimeError):
    """An id the engine already runs. vLLM accepts duplicates, and one sink per id would hand one
    caller's tokens to another: the newcomer is refused, the request already running goes on."""


@dataclass(slots=True)
class _Sink:
    """Where one request's outputs go: a queue on the caller's event loop."""

    loop: asyncio.AbstractEventLoop
    outputs: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)

    def put(self, item: Any) -> None:
        # A closed loop raises RuntimeError: its caller is gone, nobody is left to read this.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.outputs.put_nowait, item)


@dataclass(frozen=True, slots=True)
class _Add:
    request_id: str
    prompt: str
    sampling: Any
    sink: _Sink
    priority: int = 0


@dataclass(frozen=True, slots=True)
class _Abort:
    request_id: str
    sink: _Sink  # only the request this sink belongs to: never another caller's under the same id


@dataclass(frozen=True, slots=True)
class _Call:
    """Run `fn(engine)` on the engine thread and hand its result (or error) to `done`."""

    fn: Callable[[Any], Any]
    done: Callable[[Any, BaseException | None], None]


_Command = _Add | _Abort | _Call | None  # None: stop


def _shutdown_core(engine: Any) -> None:
    core = getattr(engine, "engine_core", None)
    if core is not None:
        try:
            core.shutdown()
        except Exception:  # stopping anyway; a failure here must not hide why the thread ended
            log.warning("generator engine core did not shut down cleanly", exc_info=True)


def in_process_engine_env() -> None:
    """Before the engine is built in this process: its core runs here, and its start-up scan works."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    _give_llvmlite_a_plain_dict()


def _give_llvmlite_a_plain_dict() -> None:
    """vLLM's CPU worker, starting, reads `vars(x)` of every object of every loaded module. The
    llvmlite library handle (loaded with numba, which bm25s imports) answers any attribute name,
    `__dict__` included, with a function wrapper, and that scan then fails. In vLLM's own layout the
    worker is a fresh process where llvmlite is not loaded yet. Its handle caches the attributes it
    made, so a real, empty `__dict__` entry is what the scan finds instead."""
    ffi = sys.modules.get("llvmlite.binding.ffi")
    table = getattr(getattr(ffi, "lib", None), "_fntab", None)
    if isinstance(table, dict):
        table.setdefault("__dict__", {})


class ThreadedEngine:
    """The subset of AsyncLLM the generator uses (generate, counts, health, shutdown)."""

    def __init__(
        self,
        build: Callable[[], Any],
        stall_s: float = default_of(GeneratorSettings, "stall_s"),
        before_step: Callable[[], None] | None = None,
    ) -> None:
        """`before_step`: called on the engine thread before every step (the thread count is set there)."""
        self._build = build
        self._stall_s = stall_s
        self._before_step = before_step
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._taken: collections.deque[_Command] = collections.deque()
        self._sinks: dict[str, _Sink] = {}
        # Set once, under the lock, when the thread takes no more commands: a sender either sees it
        # or has put its command where the closing drain finds it.
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vllm-engine", daemon=True)
        self._unfinished = 0
        self._busy_since = 0.0  # monotonic start of the engine call running now; 0: waiting for work

    @property
    def errored(self) -> bool:
        return self._error is not None or (self._ready.is_set() and not self._thread.is_alive())

    def start(self) -> None:
        """Build the engine on its own thread; raises what building it raised."""
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            engine = self._build()
        except BaseException as exc:  # handed to start(), which raises it in the caller
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        reason: BaseException = EngineThreadDead("the generator stopped")
        try:
            self._serve(engine)
        except BaseException as exc:  # the engine is gone: every caller is told, none waits forever
            log.exception("generator engine thread failed")
            reason = exc
        finally:
            self._close(reason)
            _shutdown_core(engine)

    def _close(self, reason: BaseException) -> None:
        """Every caller still waiting, every command queued and every later one gets `reason`."""
        with self._lock:
            self._error = reason
        error = reason if isinstance(reason, EngineThreadDead) else EngineThreadDead(str(reason))
        for sink in self._sinks.values():
            sink.put(error)
        self._sinks.clear()
        while True:
            if self._taken:
                command = self._taken.popleft()
            else:
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    return
            if isinstance(command, _Add):
                command.sink.put(error)
            elif isinstance(command, _Call):
                command.done(None, error)

    def _serve(self, engine: Any) -> None:
        while True:
            self._take_commands(wait=not engine.has_unfinished_requests())
            while self._taken:
                command = self._taken.popleft()
                if command is None:
                    return
                with self._busy():
                    self._apply(engine, command)
            if engine.has_unfinished_requests():
                if self._before_step is not None:
                    self._before_step()
                with self._busy():
                    self._step(engine)

    @contextlib.contextmanager
    def _busy(self) -> Iterator[None]:
        self._busy_since = time.monotonic()
        try:
            yield
        finally:
            self._busy_since = 0.0

    def _take_commands(self, wait: bool) -> None:
        """Every queued command, so a burst of requests joins one batch; idle, wait for the first."""
        try:
            self._taken.append(self._commands.get(block=wait))
            while True:
                self._taken.append(self._commands.get_nowait())
        except queue.Empty:
            pass

    def _apply(self, engine: Any, command: _Add | _Abort | _Call) -> None:
        if isinstance(command, _Add):
            if command.request_id in self._sinks:
                command.sink.put(DuplicateRequestId(f"engine request id {command.request_id} is in use"))
                return
            try:
                engine.add_request(command.request_id, command.prompt, command.sampling, priority=command.priority)
            except Exception as exc:  # this prompt was refused (too long...); others go on
                command.sink.put(exc)
                return
            self._sinks[command.request_id] = command.sink
        elif isinstance(command, _Abort):
            if self._sinks.get(command.request_id) is command.sink:
                del self._sinks[command.request_id]
                engine.abort_request([command.request_id])
        else:
            try:
                result, error = command.fn(engine), None
            except Exception as exc:
                result, error = None, exc
            command.done(result, error)
        self._unfinished = engine.get_num_unfinished_requests()

    def _step(self, engine: Any) -> None:
        for output in engine.step():
            sink = self._sinks.get(output.request_id)
            if sink is None:
                continue  # aborted while the step ran
            if output.finished:
                del self._sinks[output.request_id]
            sink.put(output)
        self._unfinished = engine.get_num_unfinished_requests()

    def _send(self, command: _Command) -> None:
        with self._lock:
            if self.errored:
                raise EngineThreadDead(str(self._error or "engine thread stopped"))
            self._commands.put(command)

    async def generate(self, prompt: str, sampling: Any, request_id: str, priority: int = 0) -> AsyncIterator[Any]:
        """Outputs as AsyncLLM.generate yields them; leaving early aborts the request."""
        sink = _Sink(asyncio.get_running_loop())
        self._send(_Add(request_id, prompt, sampling, sink, priority))
        finished = False
        try:
            while not finished:
                item = await sink.outputs.get()
                if isinstance(item, BaseException):
                    raise item
                finished = bool(item.finished)
                yield item
        finally:
            if not finished and not self.errored:
                self._commands.put(_Abort(request_id, sink))

    async def call(self, fn: Callable[[Any], Any]) -> Any:
        """`fn(engine)` on the engine thread (between steps), awaited from the caller's loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def done(result: Any, error: BaseException | None) -> None:
            def settle() -> None:
                if future.done():
                    return
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(result)

            # A closed loop raises RuntimeError: its caller is gone, and the engine thread goes on.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle)

        self._send(_Call(fn, done))
        return await future

    def get_num_unfinished_requests(self) -> int:
        return self._unfinished

    async def check_health(self) -> None:
        """Raises when the thread is gone or one engine call (a step, an add) has run past the stall
        limit; answers at once, without waiting for the step in progress."""
        if self.errored:
            raise EngineThreadDead(str(self._error or "engine thread stopped"))
        started = self._busy_since
        if started and time.monotonic() - started > self._stall_s:
            raise EngineStalled(
                f"one engine call has run for {time.monotonic() - started:.1f} s "
                f"(limit {self._stall_s:g} s, RAGSERVE_GENERATOR_STALL_S)"
            )

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Blocking (up to `timeout_s`): call it off the event loop."""
        if self._thread.is_alive():
            self._commands.put(None)
            self._thread.join(timeout_s)
