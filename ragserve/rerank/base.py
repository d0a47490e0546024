"""The reranking contracts: one cross-encoder tier, the reranker the pipeline calls, and which
reranker serves a given index version."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from ragserve.budget import Deadline
from ragserve.types import Passage


@dataclass(frozen=True, slots=True)
class EncodedPair:
    """One (query, passage) pair as token ids, unpadded: batches pad to their own longest pair."""

    input_ids: tuple[int, ...]
    token_type_ids: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.input_ids)


@runtime_checkable
class CrossEncoder(Protocol):
    """A cross-encoder model: scores (query, passage) pairs, higher is more relevant."""

    @property
    def model_id(self) -> str: ...

    @property
    def backend(self) -> str:
        """e.g. "torch-fp32" or "onnx-int8"."""
        ...

    @property
    def random_head(self) -> bool:
        """True for the architecture-identical test models, whose scores mean nothing."""
        ...

    def encode(self, query: str, texts: Sequence[str]) -> list[EncodedPair]:
        """Tokenize pairs, truncated to the tier's max sequence length."""
        ...

    def score(self, pairs: Sequence[EncodedPair]) -> np.ndarray:
        """One forward pass over `pairs` (padded to the longest of them); float32 scores."""
        ...


@dataclass(slots=True)
class RerankOutcome:
    """The candidates in their new order, and what ran: e.g. tiers ["tier1:12", "tier2:3"]."""

    passages: list[Passage]
    tiers: list[str] = field(default_factory=list)
    # No tier scored anything: the fused order is served as is.
    skipped: bool = False
    # A tier ran at less than its configured depth, or tier 2 was left out.
    truncated: bool = False
    notes: list[str] = field(default_factory=list)
    rerank_ms: float = 0.0


@runtime_checkable
class Reranker(Protocol):
    """Reorders fused candidates under the request's Deadline. Blocking: call it off the event loop."""

    @property
    def candidates(self) -> int:
        """How many fused candidates the search step should hand over."""
        ...

    def describe(self) -> list[str]:
        """The active tiers for health/info, e.g. "tier1 cross-encoder/ms-marco-MiniLM-L-2-v2 onnx-int8"."""
        ...

    def warm_up(self) -> None:
        """Load-time work: first passes, and each tier's cost measured at this host's load."""
        ...

    def rerank(self, query: str, passages: Sequence[Passage], deadline: Deadline) -> RerankOutcome:
        """Never raises for lack of time: it scores what fits and says what it cut."""
        ...


@dataclass(frozen=True, slots=True)
class TunedCrossEncoder:
    """A version's tuned cross-encoder and what its tuning found."""

    encoder: CrossEncoder  # its ONNX cross-encoder
    ce_weight: float
    beats_fused: bool
    model_id: str
    max_seq_len: int


class RerankerSource(Protocol):
    """Which reranker (if any) serves one index version, chosen when the version is loaded."""

    def for_version(self, version: str, tuned: TunedCrossEncoder | None) -> Reranker | None:
        """The reranker for a version that ships `tuned` (or none); not warmed up yet."""
        ...

    def cache_tags(self) -> tuple[str, ...]:
        """What the choice depends on besides the index version, for cache keys."""
        ...
