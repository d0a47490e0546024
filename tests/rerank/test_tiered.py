"""The budgeted two-tier reranker's mechanics (and a tier's blend with the fused score), with
Fake cross-encoders (no model weights)."""

from __future__ import annotations

import itertools

import pytest

from ragserve.budget import Deadline
from ragserve.rerank.blend import blend, blended_order, normalized_fused
from ragserve.rerank.cost import CostModel, plan_batches
from ragserve.rerank.tiered import Tier, TieredReranker
from ragserve.types import Chunk, Passage
from tests.fakes import FakeClock, FakeCrossEncoder


def candidates(n: int = 20, words: int = 100) -> list[Passage]:
    out = []
    for i in range(n):
        # Later (lower fused rank) passages are more "relevant": reranking must move them up.
        text = " ".join(["relevant"] * i + ["filler"] * (words - i))
        out.append(Passage(Chunk(f"c{i:02d}", f"d{i:02d}", text), score=1.0 - i / 100, rank=i + 1))
    return out


def make(cost_ms_per_token: float = 0.01, batch_size: int = 4) -> TieredReranker:
    t1 = Tier("tier1", FakeCrossEncoder("fake-l2"), 20, batch_size, CostModel(cost_ms_per_token, 1.0))
    t2 = Tier("tier2", FakeCrossEncoder("fake-l6"), 5, batch_size, CostModel(cost_ms_per_token * 3, 1.0))
    return TieredReranker([t1, t2], candidates=20, reserve_ms=0.0)


def depths(tiers: list[str]) -> tuple[int, int]:
    found = dict(t.split(":") for t in tiers)
    return int(found.get("tier1", 0)), int(found.get("tier2", 0))


def simulated(clock: FakeClock) -> TieredReranker:
    c1, c2 = CostModel(0.01, 1.0), CostModel(0.03, 1.0)
    t1 = Tier("tier1", FakeCrossEncoder("fake-l2", clock=clock, cost=c1), 20, 4, c1)
    t2 = Tier("tier2", FakeCrossEncoder("fake-l6", clock=clock, cost=c2), 5, 4, c2)
    return TieredReranker([t1, t2], candidates=20, reserve_ms=0.0, timer=clock)


def test_tier_choice_shrinks_as_budget_shrinks() -> None:
    seen = []
    for budget in (1000, 60, 45, 40, 35, 30, 25, 20, 12, 8, 4, 1):
        clock = FakeClock()
        outcome = simulated(clock).rerank("q", candidates(), Deadline(budget, clock=clock))
        # The simulated work never exceeds the budget: the plan matches the cost it was given.
        assert (clock.now - 100.0) * 1000.0 <= budget + 1e-6
        seen.append((budget, depths(outcome.tiers)))
    # Both tiers at full depth with room to spare; nothing at all with almost none.
    assert seen[0][1] == (20, 5)
    assert seen[-1][1] == (0, 0)
    for (_, (a1, a2)), (_, (b1, b2)) in itertools.pairwise(seen):
        assert b1 <= a1 and b2 <= a2, seen
    # Tier 2 gives way first: tier 1 never runs below full depth while tier 2 still runs.
    for _, (d1, d2) in seen:
        assert d2 == 0 or d1 == 20, seen
    # Each tier shrinks through intermediate depths, not just on/off.
    assert any(0 < d2 < 5 for _, (_, d2) in seen), seen
    assert any(2 <= d1 < 20 for _, (d1, _) in seen), seen


def test_flags_and_reordering() -> None:
    full = make().rerank("q", candidates(), Deadline(1000))
    assert not full.skipped and not full.truncated
    # The fake rewards "relevant": the last fused candidate becomes first.
    assert [p.chunk.chunk_id for p in full.passages[:3]] == ["c19", "c18", "c17"]

    clock = FakeClock()
    partial = simulated(clock).rerank("q", candidates(), Deadline(20, clock=clock))
    assert partial.truncated and not partial.skipped and partial.notes


def test_tiny_budget_returns_fused_order_flagged() -> None:
    # 10 ms budget, most of it already spent by embedding and search (simulated by the clock).
    clock = FakeClock(0.0)
    deadline = Deadline(10, clock=clock)
    clock.advance(0.009)
    fused = candidates()
    outcome = make().rerank("q", fused, deadline)
    assert outcome.skipped and outcome.tiers == []
    assert outcome.passages == fused
    assert any("skipped" in n for n in outcome.notes)


def test_batches_are_length_sorted_and_padded_per_batch() -> None:
    lengths = [5, 50, 7, 48, 20, 22, 6, 49]
    batches = plan_batches(lengths, 3)
    assert [[lengths[i] for i in b] for b in batches] == [[50, 49, 48], [22, 20, 7], [6, 5]]
    reranker = make(batch_size=3)
    fused = [Passage(Chunk(f"c{i}", "d", " ".join(["w"] * n)), 1.0) for i, n in enumerate(lengths)]
    reranker.rerank("q", fused, Deadline(10_000))
    seen = reranker.tiers[0].encoder.batches  # type: ignore[attr-defined]
    assert seen[0] == [50, 49, 48]


def test_stalled_reranker_overruns_by_at_most_one_batch() -> None:
    # The cost model believes tier 1 is fast; the encoder stalls 40 ms per batch (of 4 pairs of
    # 100 tokens), in simulated time: the bound is exact, whatever this host's load.
    batch_ms = 40.0
    budget_ms = 60.0
    clock = FakeClock()
    believed = CostModel(0.0005, 1.0)
    stalling = FakeCrossEncoder("fake-l2", clock=clock, cost=CostModel(batch_ms / 400, 0.0))
    tiers = [Tier("tier1", stalling, 20, 4, believed), Tier("tier2", FakeCrossEncoder("fake-l6"), 5, 4, believed)]
    reranker = TieredReranker(tiers, candidates=20, reserve_ms=0.0, timer=clock)
    outcome = reranker.rerank("q", candidates(), Deadline(budget_ms, clock=clock))
    elapsed = (clock.now - 100.0) * 1000.0
    assert elapsed <= budget_ms + batch_ms + 1e-6, elapsed
    assert len(stalling.batches) < 5  # not all 20 pairs: it stopped before a batch it had no time for
    assert outcome.truncated or outcome.skipped
    assert len(outcome.passages) == 20
    # The live timings taught the cost model that the tier is slow.
    assert reranker.tiers[0].cost is not None and reranker.tiers[0].cost.ms_per_token > 0.0005


def test_cost_model_fit_and_updates() -> None:
    model = CostModel.fit([(100, 3.0), (1000, 12.0), (2000, 22.0)])
    assert abs(model.ms_per_token - 0.01) < 1e-3 and abs(model.overhead_ms - 2.0) < 0.5
    before = model.ms_per_token
    model.observe(1000, 100.0)  # a slow batch: the estimate rises fast
    risen = model.ms_per_token
    assert risen > before + 0.03
    model.observe(1000, 4.0)  # a fast one: it falls slowly
    assert risen > model.ms_per_token > before
    assert model.predict_batches([100, 100, 100, 100], 2) == 2 * model.predict(200)


def test_scattered_batch_times_make_the_plan_leave_room() -> None:
    steady = CostModel(0.01, 1.0)
    for _ in range(20):
        steady.observe(1000, steady.predict(1000))
    assert steady.safety() == 1.0
    # Same mean cost, but one batch in four runs twice as slow (a busy neighbour on the cores).
    scattered = CostModel(0.01, 1.0, rise=0.0, fall=0.0)
    for i in range(40):
        scattered.observe(1000, scattered.predict(1000) * (2.0 if i % 4 == 0 else 0.9))
    assert scattered.safety() == 2.0

    def depth(cost: CostModel) -> int:
        # A frozen clock: the plan sees exactly 30 ms left, whatever this host's speed.
        frozen = FakeClock()
        tier = Tier("tier1", FakeCrossEncoder(), 20, 4, cost)
        reranker = TieredReranker([tier], candidates=20, reserve_ms=0.0, timer=frozen)
        return depths(reranker.rerank("q", candidates(), Deadline(30, clock=frozen)).tiers)[0]

    assert 0 < depth(scattered) < depth(steady)


def test_a_burst_of_load_does_not_switch_reranking_off_for_good() -> None:
    clock = FakeClock()
    cost = CostModel(0.01, 1.0, clock=clock)
    # A burst: batches ran 10x slower than at warm-up; the estimate and the safety factor both rose.
    slow_ms = cost.predict(1000) * 10
    for _ in range(20):
        cost.observe(1000, slow_ms)
    assert cost.ms_per_token > 0.09 and cost.safety() > 1.5
    frozen = FakeClock()
    tier = Tier("tier1", FakeCrossEncoder(), 20, 4, cost)
    reranker = TieredReranker([tier], candidates=20, reserve_ms=0.0, timer=frozen)

    def depth() -> int:
        return depths(reranker.rerank("q", candidates(), Deadline(30, clock=frozen)).tiers)[0]

    assert depth() == 0  # nothing fits while the burst is fresh, so no batch runs to correct it
    clock.now += 60.0  # a minute with no batch confirming the burst
    assert depth() > 0
    assert cost.ms_per_token < 0.02


def test_fixed_policy_ignores_the_budget() -> None:
    t1 = Tier("tier1", FakeCrossEncoder(), 20, 4, CostModel(1.0))
    t2 = Tier("tier2", FakeCrossEncoder(), 5, 4, CostModel(1.0))
    outcome = TieredReranker([t1, t2], 20, policy="fixed", reserve_ms=2.0).rerank("q", candidates(), Deadline(1))
    assert outcome.tiers == ["tier1:20", "tier2:5"]


def chunk_ids(passages: list[Passage]) -> list[str]:
    return [p.chunk.chunk_id for p in passages]


def blending(ce_weight: float, max_depth: int = 10, clock: FakeClock | None = None) -> TieredReranker:
    """One tier whose order is the blend with the fused score (a tuned version's tier)."""
    cost = CostModel(0.01, 1.0)
    encoder = FakeCrossEncoder("fake-tuned", clock=clock, cost=cost if clock else None)
    tier = Tier("tier1", encoder, max_depth, 4, cost, ce_weight=ce_weight)
    if clock is None:
        return TieredReranker([tier], candidates=20, policy="fixed", reserve_ms=0.0)
    return TieredReranker([tier], candidates=20, reserve_ms=0.0, timer=clock)


def test_a_tier_with_a_ce_weight_orders_its_pairs_by_the_blend() -> None:
    # Fused scores that fall faster further down: a blend of two straight lines would only ever
    # give one of the two orders back.
    passages = [Passage(p.chunk, 1.0 - (i / 19) ** 2, p.rank) for i, p in enumerate(candidates())]
    fused = [p.score for p in passages]
    outcome = blending(0.025).rerank("q", passages, Deadline(1000))
    assert outcome.tiers == ["tier1:10"]
    ce = [float(i) for i in range(10)]  # the fake scores how often "relevant" appears: i
    order = blended_order(ce, fused, 0.025)
    assert chunk_ids(outcome.passages) == chunk_ids([passages[i] for i in order])
    # Neither the fused order (0, 1, ...) nor the cross-encoder's (9, 8, ...): the blend of both.
    assert order[:10] != list(range(10)) and order[:10] != list(range(9, -1, -1))
    assert outcome.passages[10:] == passages[10:]  # not scored: as fused
    scores = blend(ce, normalized_fused(fused), 0.025)
    assert [p.score for p in outcome.passages[:10]] == pytest.approx([scores[i] for i in order[:10]])


def test_ce_weight_zero_is_the_fused_order_and_one_the_cross_encoder_order() -> None:
    passages = candidates()
    assert chunk_ids(blending(0.0).rerank("q", passages, Deadline(1000)).passages) == chunk_ids(passages)
    ce_only = blending(1.0).rerank("q", passages, Deadline(1000)).passages
    assert chunk_ids(ce_only) == chunk_ids(passages[9::-1] + passages[10:])


def test_a_budget_cut_blends_the_scored_prefix_and_keeps_the_tail_in_fused_order() -> None:
    passages = candidates()
    clock = FakeClock()
    outcome = blending(0.5, max_depth=20, clock=clock).rerank("q", passages, Deadline(15, clock=clock))
    depth = depths(outcome.tiers)[0]
    assert 2 <= depth < 20 and outcome.truncated
    order = blended_order([float(i) for i in range(depth)], [p.score for p in passages], 0.5)
    assert chunk_ids(outcome.passages) == chunk_ids([passages[i] for i in order])
    assert outcome.passages[depth:] == passages[depth:]


def test_a_second_tier_blends_with_the_fused_scores_handed_to_the_reranker() -> None:
    passages = [Passage(p.chunk, 1.0 - (i / 19) ** 2, p.rank) for i, p in enumerate(candidates())]
    fused = {p.chunk.chunk_id: s for p, s in zip(passages, normalized_fused([p.score for p in passages]), strict=True)}
    t1 = Tier("tier1", FakeCrossEncoder("fake-l2"), 10, 4, CostModel(0.01))
    t2 = Tier("tier2", FakeCrossEncoder("fake-tuned"), 5, 4, CostModel(0.01), ce_weight=0.04)
    outcome = TieredReranker([t1, t2], 20, policy="fixed", reserve_ms=0.0).rerank("q", passages, Deadline(1000))
    top = outcome.passages[:5]  # tier 1's best five (c09..c05), reordered by tier 2's blend
    ce = [float(p.chunk.chunk_id[1:]) for p in top]  # c07 says "relevant" 7 times
    scores = blend(ce, [fused[p.chunk.chunk_id] for p in top], 0.04)
    expected = [top[i] for i in sorted(range(5), key=lambda i: -scores[i])]
    assert chunk_ids(top) == chunk_ids(expected)
    # Neither tier 1's order nor the fused one: the blend of tier 2's scores with the fused scores.
    assert chunk_ids(top) not in (["c09", "c08", "c07", "c06", "c05"], ["c05", "c06", "c07", "c08", "c09"])
