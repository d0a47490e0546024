"""The engine-on-a-thread adapter, against a fake synchronous engine (the real one: tests/e2e)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from ragserve.generate.engine_thread import EngineThreadDead, ThreadedEngine
from tests.fakes import FakeOutput, FakeSyncEngine


def _started(fake: FakeSyncEngine) -> ThreadedEngine:
    engine = ThreadedEngine(lambda: fake)
    engine.start()
    return engine


async def _texts(engine: ThreadedEngine, prompt: str, request_id: str) -> list[str]:
    return [output.text async for output in engine.generate(prompt, None, request_id)]


def test_outputs_arrive_in_order_and_every_engine_call_runs_on_the_engine_thread() -> None:
    fake = FakeSyncEngine(per_step=2)
    engine = _started(fake)
    try:
        texts = asyncio.run(_texts(engine, "a b c d e", "r1"))
        assert texts == ["a b", "a b c d", "a b c d e"]
        assert fake.threads == {"vllm-engine"}
    finally:
        engine.shutdown()
    assert fake.core_shut_down


def test_concurrent_requests_share_steps() -> None:
    fake = FakeSyncEngine()
    engine = _started(fake)

    async def both() -> list[list[str]]:
        return list(await asyncio.gather(_texts(engine, "x y z", "a"), _texts(engine, "p q", "b")))

    try:
        first, second = asyncio.run(both())
        assert first[-1] == "x y z" and second[-1] == "p q"
        assert fake.steps <= 4  # batched: 3 steps for the longer one (+1 if the second arrived late)
    finally:
        engine.shutdown()


def test_leaving_early_aborts_the_request() -> None:
    fake = FakeSyncEngine()
    engine = _started(fake)

    async def take_one() -> None:
        stream = engine.generate(" ".join(["word"] * 100_000), None, "early")
        async for _ in stream:
            break
        await stream.aclose()
        for _ in range(100):
            if fake.aborted:
                return
            await asyncio.sleep(0.01)

    try:
        asyncio.run(take_one())
        assert fake.aborted == ["early"]
        assert engine.get_num_unfinished_requests() == 0
    finally:
        engine.shutdown()


def test_a_refused_prompt_fails_that_request_only() -> None:
    engine = _started(FakeSyncEngine())
    try:
        with pytest.raises(ValueError, match="longer than"):
            asyncio.run(_texts(engine, "too long", "bad"))
        assert asyncio.run(_texts(engine, "fine", "good")) == ["fine"]
    finally:
        engine.shutdown()


def test_a_failing_step_fails_every_request_and_marks_the_engine_dead() -> None:
    engine = _started(FakeSyncEngine(fail_on_step=2))
    with pytest.raises(EngineThreadDead, match="engine step failed"):
        asyncio.run(_texts(engine, "a b c", "r"))
    assert engine.errored
    with pytest.raises(EngineThreadDead):
        asyncio.run(engine.check_health())
    with pytest.raises(EngineThreadDead):
        asyncio.run(_texts(engine, "a", "after"))


def test_a_failing_build_is_raised_by_start() -> None:
    def build() -> FakeSyncEngine:
        raise OSError("model folder unreadable")

    engine = ThreadedEngine(build)
    with pytest.raises(OSError, match="unreadable"):
        engine.start()
    assert engine.errored


def test_shutdown_ends_streams_in_flight() -> None:
    fake = FakeSyncEngine()
    gate = _gated(fake)
    engine = _started(fake)

    async def run() -> None:
        stream = engine.generate("a b c d", None, "inflight")
        reader = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.05)
        stopper = asyncio.get_running_loop().run_in_executor(None, engine.shutdown)
        gate.set()
        await stopper
        with pytest.raises(EngineThreadDead, match="stopped"):
            await reader
            async for _ in stream:
                pass

    asyncio.run(run())
    assert engine.errored


def test_health_call_runs_on_the_engine_thread() -> None:
    fake = FakeSyncEngine()
    engine = _started(fake)
    try:
        asyncio.run(engine.check_health())
        assert asyncio.run(engine.call(lambda e: threading.current_thread().name)) == "vllm-engine"
    finally:
        engine.shutdown()


@pytest.mark.slow  # a second or more of fault waits or child processes (CI runs it)
def test_the_generator_reports_a_failed_engine_thread_as_unavailable_and_unhealthy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """VllmGenerator over the thread layout, with the fake engine in place of vLLM's."""
    from ragserve.config import GeneratorSettings
    from ragserve.errors import Unavailable
    from ragserve.generate.vllm_engine import VllmGenerator
    from ragserve.prompt import build_prompt
    from ragserve.types import GenerateParams

    generator = VllmGenerator(GeneratorSettings(engine_layout="thread", model="/srv/models/unused"))
    monkeypatch.setattr(generator, "render", lambda prompt: "one two three four")
    generator._engine = _started(FakeSyncEngine(fail_on_step=1))

    async def answer() -> str:
        return "".join([c.text async for c in generator.stream(build_prompt("q", []), GenerateParams(8, 0.0), "r")])

    with pytest.raises(Unavailable, match="engine died"):
        asyncio.run(answer())
    with pytest.raises(Unavailable, match="dead"):
        asyncio.run(generator.check_health())
    with pytest.raises(Unavailable, match="not running"):
        asyncio.run(answer())


def test_in_process_env_leaves_llvmlite_scannable(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's CPU worker reads vars() of every module-level object at start-up; llvmlite's library
    handle (loaded by numba, which bm25s imports) must then give a real dict."""
    import os

    import llvmlite.binding.ffi as ffi

    from ragserve.generate.engine_thread import in_process_engine_env

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # restored after the test
    in_process_engine_env()
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert isinstance(vars(ffi.lib), dict) and vars(ffi.lib).get("kernel") is None


@pytest.mark.slow  # runs a request on the engine thread to its end
def test_a_duplicate_id_is_refused_and_its_abort_leaves_the_running_request_alone() -> None:
    """Defence behind the generator's own ids: a second request under a running id never takes
    over the first one's outputs, and giving up on it does not abort the first."""
    from ragserve.generate.engine_thread import DuplicateRequestId

    fake = FakeSyncEngine()
    gate = _gated(fake)
    engine = _started(fake)

    async def run() -> tuple[list[str], BaseException | None]:
        first = asyncio.ensure_future(_texts(engine, "one two three", "same"))
        await asyncio.sleep(0.05)  # the first is added and stepping (held at the gate)
        refused: BaseException | None = None
        try:
            await _texts(engine, "other words here", "same")
        except DuplicateRequestId as exc:
            refused = exc
        gate.set()
        return await asyncio.wait_for(first, 5), refused

    try:
        texts, refused = asyncio.run(run())
        assert isinstance(refused, DuplicateRequestId)
        assert texts[-1] == "one two three"
        assert fake.aborted == []
    finally:
        engine.shutdown()


def test_the_engine_never_sees_the_callers_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two streams under one caller id run as two engine requests, with ids the generator made."""
    from types import SimpleNamespace

    from ragserve.config import GeneratorSettings
    from ragserve.generate.vllm_engine import VllmGenerator
    from ragserve.prompt import build_prompt
    from ragserve.types import GenerateParams

    seen: list[str] = []

    class FakeAsyncEngine:
        """AsyncLLM's generate shape: one finished output echoing the prompt."""

        errored = False

        async def generate(self, prompt: str, sampling: object, request_id: str, priority: int = 0):  # type: ignore[no-untyped-def]
            seen.append(request_id)
            completion = SimpleNamespace(text=prompt, token_ids=[1], finish_reason="stop", spec_decode_metrics=None)
            yield SimpleNamespace(outputs=[completion], finished=True, prompt_token_ids=[1], num_cached_tokens=0)

    generator = VllmGenerator(GeneratorSettings(engine_layout="thread", model="/srv/models/unused"))
    monkeypatch.setattr(generator, "render", lambda prompt: prompt.user)
    generator._engine = FakeAsyncEngine()

    async def answer(question: str) -> str:
        params = GenerateParams(8, 0.0)
        return "".join([c.text async for c in generator.stream(build_prompt(question, []), params, "client-id")])

    first = asyncio.run(answer("alpha question"))
    second = asyncio.run(answer("beta question"))
    assert "alpha" in first and "beta" in second
    assert len(seen) == 2 and len(set(seen)) == 2 and "client-id" not in seen


def _gated(fake: FakeSyncEngine) -> threading.Event:
    """Hold every step of `fake` until the returned event is set."""
    gate = threading.Event()
    original_step = fake.step

    def gated_step() -> list[FakeOutput]:
        gate.wait(5)
        return original_step()

    fake.step = gated_step  # type: ignore[method-assign]
    return gate


def test_a_call_queued_behind_a_failing_step_is_answered() -> None:
    fake = FakeSyncEngine(fail_on_step=1)
    gate = _gated(fake)
    engine = _started(fake)

    async def run() -> None:
        stream = asyncio.ensure_future(_texts(engine, "a b c", "r"))
        await asyncio.sleep(0.05)  # the step is running, held at the gate
        probe = asyncio.ensure_future(engine.call(lambda e: e.get_num_unfinished_requests()))
        await asyncio.sleep(0.05)
        gate.set()
        for waiting in (stream, probe):
            with pytest.raises(EngineThreadDead, match="engine step failed"):
                await asyncio.wait_for(waiting, 5)

    asyncio.run(run())


def test_a_request_sent_while_the_engine_stops_is_refused_not_left_waiting() -> None:
    fake = FakeSyncEngine()
    gate = _gated(fake)
    engine = _started(fake)

    async def run() -> None:
        first = asyncio.ensure_future(_texts(engine, "a b c", "first"))
        await asyncio.sleep(0.05)
        engine._commands.put(None)  # what shutdown() sends; the thread is still in its step
        late = asyncio.ensure_future(_texts(engine, "x y", "late"))
        await asyncio.sleep(0.05)
        gate.set()
        for waiting in (first, late):
            with pytest.raises(EngineThreadDead, match="stopped"):
                await asyncio.wait_for(waiting, 5)

    asyncio.run(run())
    assert engine.errored


def test_a_stalled_step_reports_unhealthy_at_once_and_recovers_when_it_ends() -> None:
    from ragserve.generate.engine_thread import EngineStalled

    fake = FakeSyncEngine()
    gate = _gated(fake)
    engine = ThreadedEngine(lambda: fake, stall_s=0.1)
    engine.start()

    async def run() -> None:
        stream = asyncio.ensure_future(_texts(engine, "a b", "r"))
        await asyncio.sleep(0.3)
        with pytest.raises(EngineStalled, match="RAGSERVE_GENERATOR_STALL_S"):
            # Answers without waiting for the step, which is held at the gate until after: waiting
            # for it would time out here (5 s: a bound no loaded host comes near for an answer at once).
            await asyncio.wait_for(engine.check_health(), 5)
        gate.set()
        assert (await asyncio.wait_for(stream, 5))[-1] == "a b"
        await engine.check_health()

    try:
        asyncio.run(run())
    finally:
        engine.shutdown()


def test_a_call_answered_after_its_loop_closed_leaves_the_engine_running() -> None:
    import contextlib

    fake = FakeSyncEngine()
    engine = _started(fake)
    release = threading.Event()

    async def give_up() -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(engine.call(lambda e: release.wait(5)), 0.05)

    try:
        asyncio.run(give_up())  # the loop is closed when the engine thread answers
        release.set()
        assert asyncio.run(_texts(engine, "still here", "next")) == ["still", "still here"]
        assert not engine.errored
    finally:
        engine.shutdown()


def test_closing_the_generator_does_not_block_the_event_loop() -> None:
    from ragserve.config import GeneratorSettings
    from ragserve.generate.vllm_engine import VllmGenerator

    fake = FakeSyncEngine()
    gate = _gated(fake)
    generator = VllmGenerator(GeneratorSettings(engine_layout="thread", model="/srv/models/unused"))
    engine = _started(fake)
    generator._engine = engine

    async def run() -> int:
        stream = asyncio.ensure_future(_texts(engine, "a b c", "r"))
        await asyncio.sleep(0.05)  # a step is running: stopping waits for it
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.ensure_future(tick())
        threading.Timer(0.3, gate.set).start()
        await generator.close()
        ticker.cancel()
        await asyncio.gather(stream, ticker, return_exceptions=True)
        return ticks

    assert asyncio.run(run()) >= 10


def test_closing_a_stream_closes_the_engine_iteration_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's iteration (whose closing aborts the request) is closed when the generator's
    stream is, not later by the garbage collector's finalizer: the engine stops decoding now."""
    from types import SimpleNamespace

    from ragserve.config import GeneratorSettings
    from ragserve.generate.vllm_engine import VllmGenerator
    from ragserve.prompt import build_prompt
    from ragserve.types import GenerateParams

    closed: list[bool] = []

    class EndlessAsyncEngine:
        errored = False

        async def generate(self, prompt: str, sampling: object, request_id: str, priority: int = 0):  # type: ignore[no-untyped-def]
            text = ""
            try:
                while True:
                    text += "word "
                    completion = SimpleNamespace(text=text, token_ids=[1], finish_reason=None, spec_decode_metrics=None)
                    yield SimpleNamespace(outputs=[completion], finished=False)
                    await asyncio.sleep(0)
            finally:
                closed.append(True)  # where both engines abort the request

    generator = VllmGenerator(GeneratorSettings(engine_layout="thread", model="/srv/models/unused"))
    monkeypatch.setattr(generator, "render", lambda prompt: prompt.user)
    generator._engine = EndlessAsyncEngine()

    async def take_one_and_close() -> list[bool]:
        stream = generator.stream(build_prompt("q", []), GenerateParams(64, 0.0), "r")
        await anext(stream)
        await stream.aclose()
        return list(closed)  # before the loop runs anything else

    assert asyncio.run(take_one_and_close()) == [True]


def test_each_request_reaches_the_engine_with_its_priority() -> None:
    fake = FakeSyncEngine()
    engine = _started(fake)

    async def both() -> None:
        async def run(request_id: str, priority: int) -> None:
            async for _ in engine.generate("a b", None, request_id, priority=priority):
                pass

        await asyncio.gather(run("person", 0), run("job", 1))

    try:
        asyncio.run(both())
    finally:
        engine.shutdown()
    assert fake.priorities == {"person": 0, "job": 1}
