"""The reload benchmark's probe of the host's stalls: which read sets are stalls, which requests
they reach (the probe process itself runs only in the benchmark)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.host_stalls import REACH_S, SETTLING_SETS, HostStallProbe
from benchmarks.reload_phases import PHASES, pooled


def _probe(sets: list[tuple[float, float]]) -> HostStallProbe:
    probe = HostStallProbe(Path("unused"))
    probe.sets = [(-1.0, 50.0)] * SETTLING_SETS + sets  # the settling sets are never stalls
    return probe


def test_a_set_far_over_the_median_is_a_stall_and_the_settling_sets_are_not() -> None:
    quiet = [(float(n), 0.2) for n in range(100)]
    probe = _probe([*quiet, (100.0, 90.0), (101.0, 2.5)])
    assert probe.stalls() == [(100.0, 100.09)]


def test_a_request_near_a_stall_is_in_it_and_one_far_from_it_is_not() -> None:
    probe = _probe([*((float(n), 0.2) for n in range(100)), (50.0, 90.0)])
    near_before = (50.0 - REACH_S - 0.05, 100.0)  # ends inside the widened stall
    right_after = (50.09 + REACH_S - 0.01, 10.0)
    far = (52.0, 30.0)
    assert probe.overlapping([near_before, right_after, far]) == [True, True, False]


def test_no_sets_means_no_stalls() -> None:
    assert HostStallProbe(Path("unused")).overlapping([(1.0, 10.0)]) == [False]


def test_pooled_p99_spans_every_run_and_leaves_out_the_stalled_requests() -> None:
    def run(steady: list[tuple[float, bool]]) -> dict[str, dict[str, list[tuple[float, bool]]]]:
        return {"samples": {phase: steady for phase in PHASES}}

    quiet = [(float(ms), False) for ms in range(1, 100)]
    runs = [run(quiet), run([*quiet, (900.0, True)])]
    together = pooled(runs)
    assert together["steady requests"] == 199
    assert together["steady p99 ms"] > together["steady p99 ms, no host stall"]
    assert together["steady p99 ms, no host stall"] <= 99.0
