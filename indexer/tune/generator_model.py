"""Phase 2 of `tune-generator`: a LoRA adapter trained on the token-id dataset of phase 1.

Needs only torch, transformers, peft and tqdm (and ragserve's adapter/model_prep helpers, which
import nothing more), so it runs on a GPU host without vLLM or the index: `python -m
indexer.tune.generator_model --data DIR --base MODEL --out DIR`. CUDA when present (bf16 autocast),
else the CPU. Resumable through the tuners' checkpointed loop (training.py). Writes the adapter
folder (fp16 weights), its manifest with the base weights' digest, and held-out figures.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from indexer.tune.generator_figures import exact_match, holds_gold, is_decline
from indexer.tune.training import TrainingRun, resumable_training
from ragserve.generate.adapter import ADAPTER_MANIFEST, weights_digest

log = logging.getLogger(__name__)

_IGNORE = -100  # label of prompt and padding tokens: no loss there


@dataclass(frozen=True, slots=True)
class GeneratorTrainOptions:
    epochs: int = 2
    batch_size: int = 16
    lr: float = 2e-4
    rank: int = 16
    alpha: int = 32
    dropout: float = 0.05
    # Share of the "excluded" examples (gold paragraph left out, a decline) mixed into training.
    excluded_share: float = 0.0
    # Share of the "missed" examples (answerable, but no prompt passage quotes the answer: a
    # decline) kept; fewer teach fewer declines of answerable questions.
    missed_share: float = 1.0
    max_steps: int | None = None  # a short run (timing, smoke tests): the first steps of epoch 1
    checkpoint_every: int = 100
    seed: int = 0


def read_dataset(folder: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    with gzip.open(folder / "examples.jsonl.gz", "rt", encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return rows, json.loads((folder / "data.json").read_text())


def split_examples(rows: list[dict[str, Any]], options: GeneratorTrainOptions) -> tuple[list[Any], list[Any]]:
    """Training rows (the served-path examples, `missed_share` of the missed ones and
    `excluded_share` of the excluded ones, seeded) and the held-out rows (served-path examples of
    held-out paragraphs)."""
    rng = random.Random(options.seed)
    keep = {"excluded": options.excluded_share, "missed": options.missed_share}
    train = [r for r in rows if not r["heldout"] and rng.random() < keep.get(r["kind"], 1.0)]
    heldout = [r for r in rows if r["heldout"] and r["kind"] != "excluded"]
    return train, heldout


def load_base(base: str) -> tuple[Any, Any]:
    """A plain float32 model and its tokenizer: a model folder, or a GGUF file (converted the way
    set-up converts the embedded default, generate/model_prep.py)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if base.endswith(".gguf"):
        from ragserve.generate.model_prep import load_gguf_model

        return load_gguf_model(Path(base))
    return AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), AutoTokenizer.from_pretrained(base)


def _batch(rows: list[dict[str, Any]], pad: int, device: Any) -> dict[str, Any]:
    """Prompt + target, right-padded; only the target's tokens carry a label."""
    import torch

    longest = max(len(r["prompt"]) + len(r["target"]) for r in rows)
    ids, labels, mask = [], [], []
    for r in rows:
        seq = r["prompt"] + r["target"]
        fill = longest - len(seq)
        ids.append(seq + [pad] * fill)
        labels.append([_IGNORE] * len(r["prompt"]) + r["target"] + [_IGNORE] * fill)
        mask.append([1] * len(seq) + [0] * fill)
    return {
        "input_ids": torch.tensor(ids, device=device),
        "labels": torch.tensor(labels, device=device),
        "attention_mask": torch.tensor(mask, device=device),
    }


def _device() -> Any:
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _build_run(
    base: str, train: list[Any], options: GeneratorTrainOptions, losses: list[float]
) -> Callable[[str, bool], TrainingRun]:
    def build(start: str, resumed: bool) -> TrainingRun:
        import torch
        from peft import LoraConfig, PeftModel, get_peft_model
        from transformers import get_linear_schedule_with_warmup

        device = _device()
        model, tokenizer = load_base(base)
        if resumed:
            model = PeftModel.from_pretrained(model, start, is_trainable=True)
        else:
            lora = LoraConfig(
                r=options.rank, lora_alpha=options.alpha, lora_dropout=options.dropout, target_modules="all-linear"
            )
            model = get_peft_model(model, lora)
        model.to(device).train()
        steps = -(-len(train) // options.batch_size)
        if options.max_steps is not None:
            steps = min(steps, options.max_steps)
        epochs = 1 if options.max_steps is not None else options.epochs
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=options.lr, weight_decay=0.0)
        scheduler = get_linear_schedule_with_warmup(optimizer, max(1, steps * epochs // 20), steps * epochs)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

        def loss_at(epoch: int, offset: int) -> Any:
            order = list(range(len(train)))
            random.Random(options.seed * 1000 + epoch).shuffle(order)
            rows = [train[i] for i in order[offset * options.batch_size : (offset + 1) * options.batch_size]]
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = model(**_batch(rows, pad, device)).loss
            losses.append(float(loss.detach()))
            return loss

        return TrainingRun(loss_at, optimizer, scheduler, model.save_pretrained, steps, epochs)

    return build


def _share(flags: list[bool]) -> float | None:
    return round(sum(flags) / len(flags), 3) if flags else None


def heldout_figures(model: Any, tokenizer: Any, rows: list[Any], decline: str, batch: int = 32) -> dict[str, Any]:
    """Greedy answers to the held-out prompts, scored as the benchmark scores Query's answers."""
    import torch

    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    answers: list[tuple[dict[str, Any], str, int]] = []
    model.eval()
    for start in range(0, len(rows), batch):
        chunk = rows[start : start + batch]
        longest = max(len(r["prompt"]) for r in chunk)
        ids = torch.tensor([[pad] * (longest - len(r["prompt"])) + r["prompt"] for r in chunk], device=device)
        mask = torch.tensor([[0] * (longest - len(r["prompt"])) + [1] * len(r["prompt"]) for r in chunk], device=device)
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
            out = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=48, do_sample=False, pad_token_id=pad
            )
        for r, seq in zip(chunk, out[:, longest:].tolist(), strict=True):
            end = next((i for i, t in enumerate(seq) if t in (tokenizer.eos_token_id, pad)), len(seq))
            answers.append((r, tokenizer.decode(seq[:end], skip_special_tokens=True).strip(), end))
    answerable = [(r, a) for r, a, _ in answers if r["kind"] != "impossible"]
    unanswerable = [a for r, a, _ in answers if r["kind"] == "impossible"]
    return {
        "answerable": len(answerable),
        "unanswerable": len(unanswerable),
        "gold_held": _share([holds_gold(a, r["answers"]) for r, a in answerable]),
        "exact_match": _share([exact_match(a, r["answers"]) for r, a in answerable]),
        "declined_answerable": _share([is_decline(a, decline) for _, a in answerable]),
        "declined_unanswerable": _share([is_decline(a, decline) for a in unanswerable]),
        "completion_tokens_mean": round(sum(n for _, _, n in answers) / max(1, len(answers)), 1),
        "examples": [{"id": r["qid"], "kind": r["kind"], "answer": a} for r, a, _ in answers[:20]],
    }


def _fingerprint(data: dict[str, Any], base_digest: str, options: GeneratorTrainOptions) -> str:
    text = json.dumps([data, base_digest, asdict(options)], sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _save_half(folder: Path) -> None:
    """The final adapter's weights as fp16: half the size in the repository, no measurable change
    once merged into a float32 model."""
    import torch
    from safetensors.torch import load_file, save_file

    path = folder / "adapter_model.safetensors"
    save_file({k: v.to(torch.float16).contiguous() for k, v in load_file(str(path)).items()}, str(path))


def train_adapter(
    data: Path, base: str, out: Path, options: GeneratorTrainOptions, name: str, work: Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """Train, write `out` (the adapter and its manifest) and return the manifest."""
    import shutil

    import torch
    from peft import PeftModel

    rows, data_manifest = read_dataset(data)
    train, heldout = split_examples(rows, options)
    base_model, tokenizer = load_base(base)
    base_digest = weights_digest(base_model.state_dict())
    log.info("base weights %s; %d training examples, %d held out", base_digest, len(train), len(heldout))
    losses: list[float] = []
    work = work or out.parent / f".tune-generator-{out.name}"
    started = time.monotonic()
    final = resumable_training(
        work, _fingerprint(data_manifest, base_digest, options), asdict(options), base,
        _build_run(base, train, options, losses), options.checkpoint_every, "tune-generator", progress,
    )  # fmt: skip
    seconds = time.monotonic() - started
    model = PeftModel.from_pretrained(base_model, str(final)).to(_device())
    # A short run (--max-steps: timing, smoke tests) is not measured: its figures would mean nothing.
    measure = heldout and options.max_steps is None
    figures = heldout_figures(model, tokenizer, heldout, data_manifest["decline"]) if measure else {}
    out.mkdir(parents=True, exist_ok=True)
    for path in final.iterdir():
        if path.is_file():
            shutil.copy2(path, out / path.name)
    _save_half(out)
    manifest = {
        "name": name,
        "base": Path(base).name,
        "base_digest": base_digest,
        "data": data_manifest,
        "options": asdict(options),
        "training": {
            "examples": len(train),
            "seconds_this_run": round(seconds, 1),
            "steps_this_run": len(losses),
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "first_losses": [round(x, 4) for x in losses[:5]],
            "last_losses": [round(x, 4) for x in losses[-5:]],
        },
        "heldout": figures,
        "licence": "adapter trained on SQuAD 2.0 data (CC BY-SA 4.0); see NOTICE",
    }
    (out / ADAPTER_MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def main() -> None:
    """The training phase on its own (a GPU host with torch, transformers and peft only)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--base", required=True, help="model folder or .gguf file")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--name", default="smollm2-squad2-grounded")
    parser.add_argument("--work", type=Path)
    defaults = GeneratorTrainOptions()
    for field, value in asdict(defaults).items():
        kind = float if isinstance(value, float) else int
        parser.add_argument(f"--{field.replace('_', '-')}", type=kind, default=value)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    options = GeneratorTrainOptions(**{f: getattr(args, f) for f in asdict(defaults)})
    manifest = train_adapter(args.data, args.base, args.out, options, args.name, args.work)
    print(json.dumps({k: manifest[k] for k in ("base_digest", "training", "heldout")}, indent=2))


if __name__ == "__main__":
    main()
