"""How Query answers: the prompt's layout, support, abstaining and the decline (AnswerSettings),
and warming the engine's prefix cache with the passages Query will need (WarmingSettings)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class AnswerSettings(BaseSettings):
    """What Query answers with: the prompt's layout, the support a highlight needs, abstaining, and
    whether there is a generator at all. Variables use the RAGSERVE_ prefix (RAGSERVE_PROMPT_LAYOUT, ...)."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_", extra="forbid", frozen=True)

    # The template prefix always comes first and the question last. "reusable": the top passage
    # goes in whole (up to prompt_whole_passage_max_tokens), the same for every question, so a
    # later question retrieving it first reuses its KV from the prefix cache; the other passages
    # get what is left of the context budget. "stable": every passage cut to the question's best
    # sentences. "naive": question first, a benchmark baseline only (docs/ttft.md).
    prompt_layout: Literal["reusable", "stable", "naive"] = "reusable"
    # A longer top passage is cut to the question like the others (its prefill would cost more
    # than reuse could win back).
    prompt_whole_passage_max_tokens: int = Field(default=384, ge=1)
    # The retrieval event flags low support when the best highlight holds less than this share of
    # the question's weight (calibrated on SQuAD v2: docs/evidence.md); 0 never flags.
    low_support_below: float = Field(default=0.2, ge=0.0, le=1.0)
    # true: a Query with low support is answered "The documents do not contain the answer."
    # without calling the generator (off by default: docs/evidence.md has its precision and recall).
    abstain_on_low_support: bool = False
    # The share of questions the documents do cover that the server may decline before calling the
    # generator, judging from retrieval's raw scores and the question's words that the passages
    # hold (request/decline.py; chosen on SQuAD 2.0 with articles left out: docs/evidence.md);
    # 0 turns the decision off.
    decline_false_rate: float = Field(default=0.035, ge=0.0, le=0.3)
    # Retrieval-only mode: no generator is loaded and Query answers FAILED_PRECONDITION.
    generation_enabled: bool = True


class WarmingSettings(BaseSettings):
    """Pre-filling the engine's prefix cache with the most retrieved passages, and where their
    counts persist. Variables use the RAGSERVE_ prefix (RAGSERVE_WARM_PASSAGES, RAGSERVE_HOT_PASSAGES_PATH, ...)."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_", extra="forbid", frozen=True)

    # After start (in the background, once SERVING), after a hot reload and when a generation server
    # comes back, pre-fill the engine's prefix cache with up to this many passages: the ones Query
    # retrieval ranked first most often, then (RAGSERVE_WARM_WHOLE_CORPUS) the rest of the corpus
    # in the index's order (reusable layout only; 0 = off).
    warm_passages: int = Field(default=20_000, ge=0)
    # After the most retrieved passages, the rest of the corpus: a new deployment, a new version or a
    # corpus without history starts warm, as far as RAGSERVE_WARM_KV_SHARE goes (docs/ttft.md).
    warm_whole_corpus: bool = True
    # The most of the engine's KV cache that warming may fill. The prefix cache evicts the least
    # recently used blocks first, so warmed passages nobody asks about give way to traffic; the
    # rest is kept free for the requests running (docs/ttft.md).
    warm_kv_share: float = Field(default=0.75, gt=0.0, le=1.0)
    # Where the retrieval counts persist. Empty: hot-passages.json in the index root (hnsw), or
    # hot-passages-<collection>.json in the ragserve home (Qdrant).
    hot_passages_path: Path | None = None
    # How often the counts are written (and once at shutdown).
    hot_passages_save_s: float = Field(default=60.0, gt=0)
