"""The gate an in-process engine waits at between steps while an interactive retrieval runs."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from ragserve.generate.engine_thread import ThreadedEngine
from ragserve.retrieval_first import ENGINE_SHARE, RetrievalFirst
from tests.fakes import FakeSyncEngine


def _waited_in_thread(gate: RetrievalFirst) -> tuple[threading.Thread, list[float]]:
    waited: list[float] = []
    thread = threading.Thread(target=lambda: waited.append(gate.wait_turn()))
    thread.start()
    return thread, waited


def test_the_engine_waits_until_the_retrieval_ends() -> None:
    gate = RetrievalFirst(longest_wait_s=5.0)
    with gate.retrieving():
        thread, waited = _waited_in_thread(gate)
        time.sleep(0.2)
        assert thread.is_alive(), "the engine stepped while a retrieval ran"
    thread.join(2.0)
    assert not thread.is_alive()
    assert 0.15 <= waited[0] < 2.0


def test_nothing_retrieving_costs_no_wait() -> None:
    assert RetrievalFirst(longest_wait_s=5.0).wait_turn() == 0.0


def test_batch_retrievals_and_a_gate_turned_off_never_hold_the_engine() -> None:
    gate = RetrievalFirst(longest_wait_s=5.0)
    with gate.retrieving(interactive=False):
        assert gate.retrieving_now() == 0
        assert gate.wait_turn() == 0.0
    off = RetrievalFirst(longest_wait_s=0.0)
    with off.retrieving():
        assert off.wait_turn() == 0.0


def test_a_run_of_retrievals_cannot_stop_the_engine() -> None:
    gate = RetrievalFirst(longest_wait_s=5.0)
    with gate.retrieving():
        gate.wait_turn()  # the engine's first turn: it sat idle before, so it rests its longest
    with gate.retrieving():
        # A unit of 20 ms ran since its last turn: it rests three times that, not the retrieval's run.
        time.sleep(0.02)
        waited = gate.wait_turn()
        assert 0.05 <= waited < 0.5
        assert waited / (waited + 0.02) == pytest.approx(1 - ENGINE_SHARE, abs=0.15)


def test_after_idling_the_engine_waits_for_the_whole_retrieval_up_to_the_longest_wait() -> None:
    gate = RetrievalFirst(longest_wait_s=0.1)
    time.sleep(0.2)
    with gate.retrieving():
        assert 0.09 <= gate.wait_turn() < 1.0


def test_the_engine_thread_takes_no_step_while_a_retrieval_runs() -> None:
    gate = RetrievalFirst(longest_wait_s=5.0)
    fake = FakeSyncEngine(per_step=1)
    engine = ThreadedEngine(lambda: fake, before_step=gate.wait_turn)
    engine.start()

    async def ask() -> list[str]:
        return [output.text async for output in engine.generate("a b c", None, "r1")]

    try:
        with gate.retrieving():
            loop = asyncio.new_event_loop()
            task = loop.create_task(ask())
            loop.run_until_complete(asyncio.sleep(0.3))
            assert fake.steps == 0, "a step ran while the retrieval held the gate"
        assert loop.run_until_complete(task) == ["a", "a b", "a b c"]
        loop.close()
    finally:
        engine.shutdown()
