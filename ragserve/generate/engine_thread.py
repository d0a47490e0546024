"""vLLM's engine on one thread of the server process, with an async face like AsyncLLM's.

AsyncLLM always runs the engine core in a process of its own. On a CPU host with two cores that
process busy-polls beside the model's OpenMP threads, and with n-gram speculation (which turns off
vLLM's async scheduling) the answer was 0.74-0.78x of plain decoding there, against 0.49x with the
engine in the calling process (BENCHMARKS.md, speculation probe). This runs the synchronous
LLMEngine with its in-process core and uni executor on a dedicated thread:

- every engine call (add, abort, step) happens on that thread, since LLMEngine is not thread-safe,
  and the model's OpenMP team belongs to the thread that runs it;
- callers talk to it through a command queue; outputs come back to each caller's event loop;
- while the model runs, torch releases the GIL, so the event loop keeps serving; the engine's
  Python parts (scheduler, sampling, detokenizing) do share the GIL with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import sys
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


class EngineThreadDead(RuntimeError):
    """The engine thread stopped on an error; every request in flight gets it."""


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


@dataclass(frozen=True, slots=True)
class _Abort:
    request_id: str


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

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build = build
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._sinks: dict[str, _Sink] = {}
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vllm-engine", daemon=True)
        self._unfinished = 0

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
        try:
            self._serve(engine)
        except BaseException as exc:  # the engine is gone: every caller is told, none waits forever
            log.exception("generator engine thread failed")
            self._error = exc
            self._tell_all(EngineThreadDead(str(exc)))
        finally:
            _shutdown_core(engine)

    def _serve(self, engine: Any) -> None:
        while True:
            for command in self._take_commands(wait=not engine.has_unfinished_requests()):
                if command is None:
                    self._tell_all(EngineThreadDead("the generator stopped"))
                    return
                self._apply(engine, command)
            if engine.has_unfinished_requests():
                self._step(engine)

    def _take_commands(self, wait: bool) -> list[_Command]:
        """Every queued command, so a burst of requests joins one batch; idle, wait for the first."""
        taken: list[_Command] = []
        try:
            taken.append(self._commands.get(block=wait))
            while True:
                taken.append(self._commands.get_nowait())
        except queue.Empty:
            pass
        return taken

    def _tell_all(self, error: BaseException) -> None:
        for sink in self._sinks.values():
            sink.put(error)
        self._sinks.clear()

    def _apply(self, engine: Any, command: _Add | _Abort | _Call) -> None:
        if isinstance(command, _Add):
            try:
                engine.add_request(command.request_id, command.prompt, command.sampling)
            except Exception as exc:  # this prompt was refused (too long...); others go on
                command.sink.put(exc)
                return
            self._sinks[command.request_id] = command.sink
        elif isinstance(command, _Abort):
            if self._sinks.pop(command.request_id, None) is not None:
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
        if self.errored:
            raise EngineThreadDead(str(self._error or "engine thread stopped"))
        self._commands.put(command)

    async def generate(self, prompt: str, sampling: Any, request_id: str) -> AsyncIterator[Any]:
        """Outputs as AsyncLLM.generate yields them; leaving early aborts the request."""
        sink = _Sink(asyncio.get_running_loop())
        self._send(_Add(request_id, prompt, sampling, sink))
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
                self._commands.put(_Abort(request_id))

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

            loop.call_soon_threadsafe(settle)

        self._send(_Call(fn, done))
        return await future

    def get_num_unfinished_requests(self) -> int:
        return self._unfinished

    async def check_health(self) -> None:
        if self.errored:
            raise EngineThreadDead(str(self._error or "engine thread stopped"))
        await self.call(lambda engine: engine.get_num_unfinished_requests())

    def shutdown(self, timeout_s: float = 30.0) -> None:
        if self._thread.is_alive():
            self._commands.put(None)
            self._thread.join(timeout_s)
