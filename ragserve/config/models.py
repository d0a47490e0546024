"""The settings of the model-backed stages beside retrieval: the rerank tiers and the reader."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from ragserve.config.base import default_home


class RerankSettings(BaseSettings):
    """Cross-encoder reranking. Environment variables use the RAGSERVE_RERANK_ prefix."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_RERANK_", extra="forbid", frozen=True)

    # auto (default): the serving version's tuned cross-encoder (`ragserve-index tune-reranker`) when it
    # ships one that beat the fused order, else fused order only; tuned: the version's tuned
    # cross-encoder whenever it ships one (for measuring); off: fused order only; one-tier: tier 1
    # only; two-tier: tier 1 over the candidates, tier 2 over tier 1's best. The last two use the
    # configured models and ignore a version's tuned one.
    mode: Literal["auto", "tuned", "off", "one-tier", "two-tier"] = "auto"
    tier1_model: str = "cross-encoder/ms-marco-MiniLM-L-2-v2"
    tier2_model: str = "cross-encoder/ms-marco-MiniLM-L-6-v2"
    # Most pairs each tier may score; the budget usually decides fewer.
    tier1_max_depth: int = Field(default=20, ge=2)
    tier2_max_depth: int = Field(default=5, ge=2)
    # Fused candidates handed to tier 1 (search returns at least top_k anyway).
    candidates: int = Field(default=20, ge=2)
    # budget: depth from the time left (the point); fixed: always the max depths (for comparison).
    depth_policy: Literal["budget", "fixed"] = "budget"
    # onnx: ONNX Runtime, int8 dynamic quantization on CPU (exported once into onnx_cache_dir).
    backend: Literal["torch", "onnx"] = "onnx"
    device: Literal["cpu", "cuda"] = "cpu"
    # Query + chunk tokens; matched to the indexer's 200-token chunks plus a question.
    max_seq_len: int = Field(default=256, ge=16, le=512)
    batch_size: int = Field(default=4, ge=1)
    # ONNX Runtime intra-op threads per call (0: one per CPU in `cpus`, else ORT's default).
    threads: int = Field(default=0, ge=0)
    # CPUs the reranker's model calls run on, e.g. "1" or "0,1"; empty: no pinning.
    cpus: str = ""
    # Reranks running at once, on their own threads (embedding and search never queue behind them).
    # One: two ORT calls at once on two cores each run at half speed, while a request that waits
    # its turn plans its depth from the time it has left.
    concurrency: int = Field(default=1, ge=1)
    # Time kept back from the budget: building the response, the hop back to the event loop, and
    # a last batch that runs slower than planned (measured: BENCHMARKS.md, "Reranking").
    reserve_ms: float = Field(default=5.0, ge=0)
    onnx_cache_dir: Path = Field(default_factory=lambda: default_home() / "rerank-onnx")
    # The architecture-identical test models have random heads: refused unless this is set (benchmarks).
    allow_random_heads: bool = False


class ReaderSettings(BaseSettings):
    """The extractive reader: the answer span in the passages retrieval ranked first, and its
    no-answer score (docs/evidence.md). Environment variables use the RAGSERVE_READER_ prefix."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_READER_", extra="forbid", frozen=True)

    enabled: bool = True
    # Empty: the reader this project ships (ragserve/read/default, trained on SQuAD 2.0 data; its
    # README gives its provenance). Else a reader folder (`ragserve-index tune-reader`), or a local
    # folder or HF id holding a question-answering model (AutoModelForQuestionAnswering), exported
    # to ONNX int8 once into onnx_cache_dir.
    model: str = ""
    # Most passages read per request, best ranked first; the reader's budget usually decides fewer.
    max_passages: int = Field(default=2, ge=1, le=10)
    # The most time the reader may take per request, on the model threads. It runs beside the
    # generator's prefill, so it never holds back the first token (docs/evidence.md).
    budget_ms: float = Field(default=60.0, gt=0)
    # A span is an answer when it beats the reader's no-answer score by this margin; empty: the
    # threshold chosen on held-out questions when the model was trained (its manifest).
    threshold: float | None = None
    # true: a Query whose passages the reader finds no answer in is answered "The documents do not
    # contain the answer." without calling the generator; the reader then runs before the engine,
    # so every answer waits for it (off by default: BENCHMARKS.md, "The reader").
    abstain: bool = False
    # When a Query's reader starts. "prefill": beside the generator's prefill, so its span can go
    # with the retrieval event; "first_token": once the first token is out, so it never takes CPU
    # from the prefill (its span comes between the tokens); "auto": beside the prefill when
    # generation runs on other machines (vLLM servers), else after the first token (on a small
    # host the two would share its cores: BENCHMARKS.md, "The reader through Query").
    start: Literal["auto", "prefill", "first_token"] = "auto"
    # true: the highlight a client shows becomes the sentence holding a span that answers; false:
    # the lexical highlight stays and the span carries its own sentence (with the shipped reader the
    # lexical highlight holds a gold span as often: BENCHMARKS.md, "The reader through Query").
    highlight: bool = False
    # true: the sentence holding a span that answers is quoted again right before the question in
    # the prompt (after the passages, so the template and top passage stay in the prefix cache);
    # the reader then runs before the engine, so every answer waits for it (off by default:
    # BENCHMARKS.md, "The reader through Query").
    lead: bool = False
    # ONNX Runtime intra-op threads per call.
    threads: int = Field(default=2, ge=1)
    onnx_cache_dir: Path = Field(default_factory=lambda: default_home() / "reader-onnx")
