"""Prompt tokens a step may take, from a measured prefill speed."""

from __future__ import annotations

import pytest

from ragserve.generate.step_size import SMALLEST_CHUNK, PrefillSpeed, chunk_tokens


def test_the_fit_separates_the_cost_per_token_from_the_cost_per_step() -> None:
    speed = PrefillSpeed.fit((20, 30.0), (320, 180.0))
    assert speed.per_token_ms == pytest.approx(0.5)
    assert speed.overhead_ms == pytest.approx(20.0)


def test_a_chunk_is_whole_blocks_that_fit_the_target() -> None:
    speed = PrefillSpeed(per_token_ms=0.5, overhead_ms=20.0)
    assert chunk_tokens(speed, target_ms=100.0, block=32, most=4096) == 160  # 80 ms of tokens: 160
    assert chunk_tokens(speed, target_ms=110.0, block=32, most=4096) == 160  # 180 tokens: 5 blocks


def test_a_chunk_stays_within_the_engine_limit_and_above_the_smallest() -> None:
    fast = PrefillSpeed(per_token_ms=0.01, overhead_ms=1.0)
    assert chunk_tokens(fast, target_ms=100.0, block=32, most=2048) == 2048
    slow = PrefillSpeed(per_token_ms=5.0, overhead_ms=60.0)
    assert chunk_tokens(slow, target_ms=40.0, block=32, most=2048) == SMALLEST_CHUNK


def test_noisy_timings_never_give_a_negative_speed() -> None:
    speed = PrefillSpeed.fit((20, 50.0), (320, 40.0))
    assert speed.per_token_ms > 0
    assert speed.overhead_ms >= 0
