"""Train a cross-encoder for one corpus: listwise softmax loss over (1 relevant + n hard negative) groups.

The model starts from the bundled bi-encoder's first `layers` transformer layers (no cross-encoder
weights can be had offline). A standard [CLS] head does not learn from it: that bi-encoder was
trained with mean pooling, its [CLS] state is the same for every pair (spread ~1e-4 of its norm), and
the loss stays at ln(group size). So the head reads what the encoder does carry: the mean of the
query tokens and the mean of the passage tokens (split by token type ids) after joint attention,
scored as `scale * (q/|q| * p/|p|) . w + b` with w = 1 at the start, i.e. a cosine the training then
reweights. Every text in a group has the same form (chunk text, as the server scores it), so the
only signal is relevance, not formatting. The exported ONNX graph takes the usual BERT inputs and
gives one logit per pair, like any cross-encoder the server loads. Resumable with the bi-encoder
tuner's checkpoint helpers (training.py).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from indexer.tune.training import TrainingRun, resumable_training
from ragserve.pretrained import load_options


@dataclass(frozen=True)
class RerankGroup:
    """A query, one relevant passage and passages the index ranks high that are not relevant."""

    query: str
    positive: str
    negatives: tuple[str, ...]


@dataclass(frozen=True)
class RerankTrainOptions:
    layers: int = 2  # the tier-1 shape: deep enough to rank, cheap enough to score ~10 pairs in budget
    epochs: int = 2
    groups_per_step: int = 4
    lr: float = 1e-4  # the published SciFact run (BENCHMARKS.md); the CLI reads these defaults
    head_lr: float = 2e-3
    warmup: float = 0.1
    max_seq_len: int = 256
    checkpoint_every: int = 50
    seed: int = 13


def _steps(groups: list[RerankGroup], opts: RerankTrainOptions, epoch: int) -> list[list[RerankGroup]]:
    order = np.random.default_rng(opts.seed + epoch).permutation(len(groups))
    per = opts.groups_per_step
    return [[groups[int(i)] for i in order[s : s + per]] for s in range(0, len(order), per)]


HEAD_FILE = "segment_head.pt"
_INIT_SCALE = 20.0  # the bi-encoder's own similarity scale (MultipleNegativesRankingLoss)


def segment_match_model(model_path: str, layers: int | None = None) -> Any:
    """The cross-encoder: BERT (the first `layers` of `model_path`) + the segment-match head; a
    folder saved by `save_segment_match` is loaded with its trained head."""
    import torch
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    extra: dict[str, Any] = {} if layers is None else {"num_hidden_layers": layers}
    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity(logging.ERROR)  # the layers left out are listed as "unexpected": by design
    try:
        bert = BertModel.from_pretrained(model_path, add_pooling_layer=False, **extra, **load_options(model_path))
    finally:
        hf_logging.set_verbosity(before)

    class SegmentMatchCrossEncoder(torch.nn.Module):  # type: ignore[misc]  # torch is not followed by mypy (pyproject)
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert
            self.head = torch.nn.Linear(bert.config.hidden_size, 1)
            with torch.no_grad():
                self.head.weight.fill_(_INIT_SCALE)
                self.head.bias.zero_()

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            hidden = self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            passage = mask * token_type_ids.unsqueeze(-1).to(hidden.dtype)
            query = mask - passage
            q = (hidden * query).sum(1) / query.sum(1).clamp(min=1.0)
            p = (hidden * passage).sum(1) / passage.sum(1).clamp(min=1.0)
            q = torch.nn.functional.normalize(q, dim=-1)
            p = torch.nn.functional.normalize(p, dim=-1)
            return self.head(q * p)

    model = SegmentMatchCrossEncoder()
    head = Path(model_path) / HEAD_FILE
    if head.is_file():
        model.head.load_state_dict(torch.load(head, weights_only=True))
    return model


def save_segment_match(model: Any, tokenizer: Any, folder: Path) -> None:
    import torch

    model.bert.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    torch.save(model.head.state_dict(), folder / HEAD_FILE)


def _setup(model_path: str, groups: list[RerankGroup], opts: RerankTrainOptions, resume: bool) -> TrainingRun:
    import torch
    from transformers import AutoTokenizer, get_linear_schedule_with_warmup

    torch.manual_seed(opts.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = segment_match_model(model_path, None if resume else opts.layers)
    body, head = list(model.bert.parameters()), list(model.head.parameters())
    optimizer = torch.optim.AdamW([{"params": body, "lr": opts.lr}, {"params": head, "lr": opts.head_lr}])
    steps_per_epoch = len(_steps(groups, opts, 0))
    total = steps_per_epoch * opts.epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, math.ceil(total * opts.warmup), total)
    model.train()

    def loss_at(epoch: int, offset: int) -> Any:
        return _group_loss(model, tokenizer, _steps(groups, opts, epoch)[offset], opts.max_seq_len)

    def save(folder: Path) -> None:
        save_segment_match(model, tokenizer, folder)

    return TrainingRun(loss_at, optimizer, scheduler, save, steps_per_epoch, opts.epochs)


def _group_loss(model: Any, tokenizer: Any, batch: list[RerankGroup], max_seq_len: int) -> Any:
    import torch

    width = min(len(g.negatives) for g in batch) + 1  # equal group sizes: one softmax per row
    queries = [g.query for g in batch for _ in range(width)]
    texts = [t for g in batch for t in (g.positive, *g.negatives[: width - 1])]
    enc = tokenizer(
        queries, texts, truncation="longest_first", max_length=max_seq_len, padding=True, return_tensors="pt"
    )
    logits = model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]).view(len(batch), width)
    return torch.nn.functional.cross_entropy(logits, torch.zeros(len(batch), dtype=torch.long))


def train_cross_encoder(
    base_model: str,
    groups: list[RerankGroup],
    opts: RerankTrainOptions,
    work: Path,
    fingerprint: str,
    progress: bool = True,
    on_step: Callable[[int], None] | None = None,
) -> Path:
    """Train (or continue) and return the folder of the final model (BERT, head, tokenizer)."""
    if len(groups) < 2:
        raise ValueError(f"need at least 2 training groups, got {len(groups)}")
    if any(not g.negatives for g in groups):
        raise ValueError("every training group needs at least one negative")

    def build(path: str, resume: bool) -> TrainingRun:
        return _setup(path, groups, opts, resume)

    return resumable_training(
        work, fingerprint, asdict(opts), base_model, build, opts.checkpoint_every, "tune reranker", progress, on_step
    )
