from __future__ import annotations

from ragserve.budget import Deadline, RequestContext, StageTimer
from tests.fakes import FakeClock


def test_budget_counts_down_and_exhausts() -> None:
    clock = FakeClock()
    deadline = Deadline(70, clock=clock)
    assert abs(deadline.budget_left_ms() - 70) < 1e-6
    clock.now += 0.050
    assert abs(deadline.budget_left_ms() - 20) < 1e-6
    assert abs(deadline.elapsed_ms() - 50) < 1e-6
    assert not deadline.budget_exhausted()
    clock.now += 0.030
    assert deadline.budget_left_ms() == 0
    assert deadline.budget_exhausted()


def test_client_deadline_caps_the_budget() -> None:
    clock = FakeClock()
    deadline = Deadline(70, client_timeout_s=0.010, clock=clock)
    assert abs(deadline.budget_left_ms() - 10) < 1e-6
    assert not deadline.client_expired()
    clock.now += 0.011
    assert deadline.client_expired()
    assert deadline.client_left_s() == 0


def test_no_client_deadline() -> None:
    deadline = Deadline(70, client_timeout_s=None, clock=FakeClock())
    assert deadline.client_left_s() is None
    assert not deadline.client_expired()


def test_stage_timer_records_once() -> None:
    clock = FakeClock()
    with StageTimer(clock=clock) as timer:
        clock.now += 0.0125
    assert abs(timer.ms - 12.5) < 1e-6


def test_a_request_records_each_stage_into_its_own_timings() -> None:
    request = RequestContext(Deadline(70))
    with request.stage("embed"):
        pass
    with request.stage("cache"):
        pass
    first_lookup = request.timings.cache_ms
    with request.stage("semantic_cache", into="cache"):  # a second lookup adds to the first
        pass
    assert request.timings.embed_ms > 0 and request.timings.cache_ms > first_lookup > 0
    sent = request.timings_so_far()
    with request.stage("prompt"):
        pass
    assert sent.prompt_ms == 0 < request.timings.prompt_ms  # a copy already sent never changes
