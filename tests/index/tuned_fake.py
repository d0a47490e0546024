"""Tiny random BERTs with MiniLM's tokenizer that export to ONNX in seconds: a fake "tuned"
bi-encoder (a sentence-transformers model) and a fake tuned cross-encoder (as a version ships it).
Their vectors and scores mean nothing; they are for format, publish, reload and wiring tests only."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ragserve.config import DEFAULT_EMBEDDER
from ragserve.embed.base import resolve_embedder_path
from ragserve.rerank.tuned import TUNED_DIR as TUNED_RERANKER_DIR
from ragserve.rerank.tuned import TUNED_ONNX as TUNED_RERANKER_ONNX


def save_fake_tuned_model(folder: Path, hidden: int = 32, seed: int = 0) -> Path:
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(seed)
    raw = folder.parent / f".{folder.name}-raw"
    tokenizer = AutoTokenizer.from_pretrained(resolve_embedder_path(DEFAULT_EMBEDDER))
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=hidden * 2,
        max_position_embeddings=512,
    )
    BertModel(config).save_pretrained(raw)
    tokenizer.save_pretrained(raw)
    transformer = Transformer(str(raw), max_seq_length=128)
    pooling = Pooling(hidden, pooling_mode="mean")
    SentenceTransformer(modules=[transformer, pooling, Normalize()], device="cpu").save(str(folder))
    return folder


def save_fake_tuned_reranker(
    folder: Path, layers: int = 2, hidden: int = 32, seed: int = 0, random_head: bool = False, positions: int = 512
) -> Path:
    """A tiny random BertForSequenceClassification (one label) exported as a version ships a tuned
    cross-encoder: `folder` holds model.int8.onnx (export_bert + quantize_int8, the ONNX
    cross-encoder's export), config.json and MiniLM's tokenizer files. Its weights are drawn wide
    so its logits spread over a few units: enough to move an order."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from ragserve.onnx_export import export_bert, quantize_int8
    from ragserve.rerank.cross_encoder import RANDOM_HEAD_MARKER

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(resolve_embedder_path(DEFAULT_EMBEDDER))
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=hidden * 2,
        max_position_embeddings=positions,
        num_labels=1,
        attn_implementation="eager",  # as the ONNX cross-encoder exports
        # At BERT's usual 0.02 every pair gets the same logit to 3 decimals: nothing would move.
        initializer_range=0.5,
    )
    if random_head:
        setattr(config, RANDOM_HEAD_MARKER, True)
    net = BertForSequenceClassification(config).eval()
    raw = folder.parent / f".{folder.name}-raw"
    net.save_pretrained(raw, safe_serialization=True)
    folder.mkdir(parents=True)
    export_bert(net, raw / "model.onnx", "logits", {0: "batch"})
    quantize_int8(raw / "model.onnx", folder / "model.int8.onnx", per_channel=False)
    (folder / "config.json").write_bytes((raw / "config.json").read_bytes())
    tokenizer.save_pretrained(folder)
    return folder


def ships_tuned_reranker(model: Path, **entry: Any) -> Callable[[Path], dict[str, Any]]:
    """For `publish_tiny(ships=...)`: `model` (from save_fake_tuned_reranker) as the version's tuned
    cross-encoder; `entry` overrides fields of its manifest entry."""

    def add(build: Path) -> dict[str, Any]:
        shutil.copytree(model, build / TUNED_RERANKER_DIR)
        spec = {
            "dir": TUNED_RERANKER_DIR,
            "onnx": TUNED_RERANKER_ONNX,
            "base": "fake-ce-base",
            "layers": 2,
            "max_seq_len": 128,
            "ce_weight": 0.5,
            "beats_fused": True,
        }
        return {"tuned_reranker": {**spec, **entry}}

    return add


# Questions written for a few of the bundled sample documents: labels for whole tuning runs.
SAMPLE_QUESTIONS = {
    "bloom-filters.txt": "how can a set answer maybe with no false negatives",
    "raft-consensus.md": "how do servers elect a leader and replicate a log",
    "photosynthesis.md": "how do plants turn light into sugar",
    "plate-tectonics.txt": "why do continents drift and cause earthquakes",
    "tcp-three-way-handshake.md": "how does a connection start with syn and ack",
    "linux-oom-killer.txt": "which process does the kernel kill when memory runs out",
}


def write_sample_labels(folder: Path) -> tuple[Path, Path]:
    """BEIR `q.jsonl` and `qrels.tsv` in `folder` for SAMPLE_QUESTIONS."""
    queries, qrels = folder / "q.jsonl", folder / "qrels.tsv"
    queries.write_text("".join(f'{{"_id": "{i}", "text": "{q}"}}\n' for i, q in enumerate(SAMPLE_QUESTIONS.values())))
    qrels.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{i}\t{d}\t1\n" for i, d in enumerate(SAMPLE_QUESTIONS)))
    return queries, qrels


# Short documents for the tiny tuned-model indexes; the first five are the embedder tests' corpus.
TINY_TEXTS = [
    "Alpha particles are helium-4 nuclei: two protons and two neutrons.",
    "Beta decay emits an electron or a positron and a neutrino.",
    "Gamma rays are high-energy photons from an excited nucleus.",
    "Ocean tides are caused mainly by the pull of the moon.",
    "Sourdough bread rises through wild yeast and lactic acid bacteria.",
    "The moon's gravity raises two tidal bulges on opposite sides of the earth.",
    "Neutrons and protons are held together by the strong nuclear force.",
    "Rye flour ferments faster than wheat flour in a sourdough starter.",
]


def interrupt_at(step: int, seen: list[int]) -> Callable[[int], None]:
    """An `on_step` hook that records steps and interrupts training after `step` (a kill, for resume tests)."""

    def hook(done: int) -> None:
        seen.append(done)
        if done == step:
            raise KeyboardInterrupt

    return hook
