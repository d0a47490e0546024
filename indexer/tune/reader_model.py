"""The reader's training: a BERT encoder with a span head (start and end logits per token), trained
on (question, paragraph) pairs, SQuAD 2.0 style: the gold span's first and last tokens, or [CLS]
(position 0) for both when the paragraph does not answer. Torch on CPU, seeded."""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from ragserve.pretrained import load_options

if TYPE_CHECKING:  # the CLI imports this module for its defaults: keep it light
    from indexer.tune.reader_data import SpanExample

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReaderTrainOptions:
    epochs: int = 2
    batch_size: int = 16
    lr: float = 1e-4
    warmup: float = 0.06
    # Training pairs are cut to this many tokens (the paragraph side only); a span past it teaches "no answer".
    max_length: int = 256
    # Training stops after this many seconds (the schedule is shortened to fit once the step time is known).
    max_seconds: float | None = None
    max_steps: int | None = None
    threads: int = 2
    seed: int = 0


@dataclass(frozen=True, slots=True)
class EncodedExample:
    input_ids: list[int]
    token_type_ids: list[int]
    start: int
    end: int


@dataclass(frozen=True)
class TrainStats:
    examples: int
    answerable: int
    dropped_spans: int  # answer past max_length: taught as "no answer"
    steps: int
    planned_steps: int
    seconds: float
    last_loss: float


def encode_examples(tokenizer: Any, examples: list[SpanExample], max_length: int) -> tuple[list[EncodedExample], int]:
    """Token ids and the gold span's token positions ([CLS] = 0 for no answer)."""
    enc = tokenizer(
        [e.question for e in examples],
        [e.paragraph for e in examples],
        truncation="only_second",
        max_length=max_length,
        return_offsets_mapping=True,
        return_token_type_ids=True,
    )
    out, dropped = [], 0
    for i, ex in enumerate(examples):
        start = end = 0
        if ex.answer_start is not None:
            a0, a1 = ex.answer_start, ex.answer_start + len(ex.answer_text)
            tokens = [
                t
                for t, (seq, (o0, o1)) in enumerate(zip(enc.sequence_ids(i), enc["offset_mapping"][i], strict=True))
                if seq == 1 and o1 > a0 and o0 < a1
            ]
            if tokens:
                start, end = tokens[0], tokens[-1]
            else:
                dropped += 1
        out.append(EncodedExample(enc["input_ids"][i], enc["token_type_ids"][i], start, end))
    return out, dropped


def _batches(examples: list[EncodedExample], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Shuffled, then sorted by length within windows of 32 batches so a batch pads little."""
    order = list(range(len(examples)))
    rng.shuffle(order)
    window = batch_size * 32
    batches: list[list[int]] = []
    for at in range(0, len(order), window):
        part = sorted(order[at : at + window], key=lambda i: len(examples[i].input_ids))
        batches.extend(part[b : b + batch_size] for b in range(0, len(part), batch_size))
    rng.shuffle(batches)
    return batches


def _tensors(examples: list[EncodedExample], batch: list[int], pad_id: int) -> dict[str, Any]:
    import torch

    width = max(len(examples[i].input_ids) for i in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    types = torch.zeros((len(batch), width), dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, i in enumerate(batch):
        n = len(examples[i].input_ids)
        ids[row, :n] = torch.tensor(examples[i].input_ids)
        types[row, :n] = torch.tensor(examples[i].token_type_ids)
        mask[row, :n] = 1
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": types,
        "start_positions": torch.tensor([examples[i].start for i in batch]),
        "end_positions": torch.tensor([examples[i].end for i in batch]),
    }


def span_model(base: str) -> tuple[Any, Any]:
    """The base weights with a fresh span head (a BertModel checkpoint has none), and its tokenizer."""
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity(logging.ERROR)  # "qa_outputs newly initialized": by design
    try:
        model = AutoModelForQuestionAnswering.from_pretrained(base, attn_implementation="eager", **load_options(base))
    finally:
        hf_logging.set_verbosity(before)
    tokenizer = AutoTokenizer.from_pretrained(base, **load_options(base))
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"{base}: the reader needs a fast tokenizer (tokenizer.json) for character offsets")
    return model, tokenizer


def _optimizer(model: Any, opts: ReaderTrainOptions, plan: dict[str, int]) -> tuple[Any, Any]:
    """AdamW with a linear warm-up, then a linear decay to zero at `plan["total"]` (read at every
    step: a time-bounded run moves it)."""
    import torch

    warmup = max(1, math.ceil(plan["total"] * opts.warmup))

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (plan["total"] - step) / max(1, plan["total"] - warmup))

    optimizer = torch.optim.AdamW(model.parameters(), lr=opts.lr, weight_decay=0.01)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def _fit_plan_to_time(plan: dict[str, int], planned: int, step: int, elapsed_s: float, max_seconds: float) -> None:
    """Fit the schedule to the time allowed at the pace so far (a shared host's pace changes), so
    the learning rate still decays to zero when the time is up; past it, the run ends."""
    if step % 10 == 0:
        plan["total"] = max(step + 1, min(planned, int(max_seconds / (elapsed_s / step))))
    if elapsed_s > max_seconds:
        plan["total"] = step


def train_span_model(
    base: str,
    examples: list[SpanExample],
    opts: ReaderTrainOptions,
    progress: bool = True,
    on_step: Callable[[int, float], None] | None = None,
) -> tuple[Any, Any, TrainStats]:
    """Train from `base`; returns the model (eval mode), its tokenizer and what the run did."""
    import torch

    if len(examples) < 2:
        raise ValueError(f"need at least 2 training examples, got {len(examples)}")
    torch.set_num_threads(opts.threads)
    torch.manual_seed(opts.seed)
    rng = random.Random(opts.seed)
    model, tokenizer = span_model(base)
    encoded, dropped = encode_examples(tokenizer, examples, opts.max_length)
    pad_id = int(tokenizer.pad_token_id or 0)
    per_epoch = math.ceil(len(encoded) / opts.batch_size)
    plan = {
        "total": per_epoch * opts.epochs if opts.max_steps is None else min(opts.max_steps, per_epoch * opts.epochs)
    }
    planned = plan["total"]
    optimizer, scheduler = _optimizer(model, opts, plan)
    model.train()
    started = time.monotonic()
    step, loss_value = 0, float("nan")
    bar = tqdm(total=plan["total"], desc="tune reader", unit="step", disable=not progress)
    for _epoch in range(opts.epochs):
        for batch in _batches(encoded, opts.batch_size, rng):
            if step >= plan["total"]:
                break
            loss = model(**_tensors(encoded, batch, pad_id)).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            loss_value = float(loss.detach())
            bar.update(1)
            bar.set_postfix(loss=f"{loss_value:.3f}")
            if on_step is not None:
                on_step(step, loss_value)
            if opts.max_seconds is not None:
                _fit_plan_to_time(plan, planned, step, time.monotonic() - started, opts.max_seconds)
                bar.total = plan["total"]
    bar.close()
    model.eval()
    stats = TrainStats(
        examples=len(encoded),
        answerable=sum(1 for e in examples if e.answer_start is not None),
        dropped_spans=dropped,
        steps=step,
        planned_steps=planned,
        seconds=round(time.monotonic() - started, 1),
        last_loss=round(loss_value, 4),
    )
    return model, tokenizer, stats
