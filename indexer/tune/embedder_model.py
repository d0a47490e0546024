"""Fine-tune the bi-encoder: MultipleNegativesRankingLoss (in-batch negatives + mined hard ones).

Resumable through the shared loop (training.py): a restart with the same examples and options
continues from the last checkpoint. Memory stays bounded by the batch: examples are short texts,
one batch is in flight.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexer.tune.training import TrainingRun, resumable_training


@dataclass(frozen=True)
class Example:
    """One query (or title), one relevant passage, and passages the index ranks high but are not relevant."""

    anchor: str
    positive: str
    negatives: tuple[str, ...]


@dataclass(frozen=True)
class TrainOptions:
    epochs: int = 2  # the CLI default, measured (BENCHMARKS.md, "Tuning")
    batch_size: int = 16
    lr: float = 2e-5
    warmup: float = 0.1
    checkpoint_every: int = 20
    seed: int = 13
    max_seq_length: int = 256


def _batches(examples: list[Example], opts: TrainOptions, epoch: int) -> list[list[Example]]:
    """The epoch's batches in a seeded order. Every example of a batch has the same number of
    negatives (the fewest among them), as the loss needs equal columns."""
    order = np.random.default_rng(opts.seed + epoch).permutation(len(examples))
    batches = []
    for start in range(0, len(order), opts.batch_size):
        batch = [examples[int(i)] for i in order[start : start + opts.batch_size]]
        if len(batch) > 1:  # a batch of one has no in-batch negatives
            batches.append(batch)
    return batches


def _columns(batch: list[Example]) -> list[list[str]]:
    width = min(len(e.negatives) for e in batch)
    cols = [[e.anchor for e in batch], [e.positive for e in batch]]
    cols += [[e.negatives[j] for e in batch] for j in range(width)]
    return cols


def train(
    base_model: str,
    examples: list[Example],
    opts: TrainOptions,
    work: Path,
    fingerprint: str,
    progress: bool = True,
    on_step: Callable[[int], None] | None = None,
) -> Path:
    """Train (or continue training) and return the folder of the final sentence-transformers model."""
    if len(examples) < 2:
        raise ValueError(f"need at least 2 training examples, got {len(examples)}")

    def build(path: str, _resume: bool) -> TrainingRun:
        return _setup(path, examples, opts)

    return resumable_training(
        work, fingerprint, asdict(opts), base_model, build, opts.checkpoint_every, "tune", progress, on_step
    )


def _setup(model_path: str, examples: list[Example], opts: TrainOptions) -> TrainingRun:
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from transformers import get_linear_schedule_with_warmup

    torch.manual_seed(opts.seed)
    model = SentenceTransformer(model_path, device="cpu")
    model.max_seq_length = opts.max_seq_length
    steps_per_epoch = len(_batches(examples, opts, 0))
    total = steps_per_epoch * opts.epochs
    optimizer = torch.optim.AdamW(model.parameters(), lr=opts.lr)
    scheduler = get_linear_schedule_with_warmup(optimizer, math.ceil(total * opts.warmup), total)
    loss_fn = MultipleNegativesRankingLoss(model)
    model.train()

    def loss_at(epoch: int, offset: int) -> Any:
        batch = _batches(examples, opts, epoch)[offset]
        return loss_fn([model.preprocess(col) for col in _columns(batch)], None)

    return TrainingRun(
        loss_at, optimizer, scheduler, lambda folder: model.save(str(folder)), steps_per_epoch, opts.epochs
    )
