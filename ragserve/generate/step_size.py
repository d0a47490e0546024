"""How many prompt tokens one engine step may take, from this host's measured prefill speed.

vLLM's CPU default schedules up to 4,096 tokens a step, so a whole prompt (a warming passage, another
caller's question) prefills in one step of hundreds of milliseconds on a slow host, and nothing else
gets the CPU until it ends: not a retrieval with a 70 ms budget (ragserve/retrieval_first.py waits
between steps, never inside one). Chunked prefill cuts a prompt into steps of at most this many
tokens; sized from the host's own speed, a step stays near the step target on every host kind.
"""

from __future__ import annotations

from dataclasses import dataclass

# Fewer tokens than this a step and prefill pays the per-step overhead too often; a decode batch of
# the engine's sequences with their speculative drafts also fits.
SMALLEST_CHUNK = 64


@dataclass(frozen=True, slots=True)
class PrefillSpeed:
    """A fit of two uncached prefills' times against their sizes."""

    per_token_ms: float
    overhead_ms: float  # what a step costs besides its tokens (scheduling, sampling, drafting)

    @classmethod
    def fit(cls, small: tuple[int, float], large: tuple[int, float]) -> PrefillSpeed:
        """From (uncached tokens, ms) of a small and a large prefill."""
        (n_small, ms_small), (n_large, ms_large) = small, large
        per_token = max(1e-3, (ms_large - ms_small) / max(1, n_large - n_small))
        return cls(per_token, max(0.0, ms_small - per_token * n_small))

    def describe(self) -> str:
        return f"{1000.0 / self.per_token_ms:.0f} prompt tokens/s, {self.overhead_ms:.0f} ms a step besides"


def chunk_tokens(speed: PrefillSpeed, target_ms: float, block: int, most: int) -> int:
    """Prompt tokens a step may schedule to take about `target_ms`: whole KV blocks, at least
    SMALLEST_CHUNK, at most `most` (the engine's own limit)."""
    fits = (target_ms - speed.overhead_ms) / speed.per_token_ms
    blocks = int(fits // block) * block
    return max(SMALLEST_CHUNK, min(most, blocks))
