"""Architecture-identical TEST models for the reranker: random weights, random classification heads.

No cross-encoder weights can be downloaded where this project is built, so the tests and the
latency benchmark build BERT models with the exact shapes of cross-encoder/ms-marco-MiniLM-L-2-v2
and -L-6-v2 (384 hidden, 12 heads, 1536 intermediate, 512 positions, one label) and the bundled
MiniLM tokenizer (same BERT uncased vocabulary). Their cost per token matches the real models;
their scores mean nothing. Each config carries a marker, and the server refuses to load a marked
model unless RAGSERVE_RERANK_ALLOW_RANDOM_HEADS=true (benchmarks only). Never a default.

    python -m tests.rerank.models OUT_DIR   # writes OUT_DIR/minilm-l2-random and OUT_DIR/minilm-l6-random
"""

from __future__ import annotations

import sys
from pathlib import Path

from ragserve.embed.base import resolve_embedder_path
from ragserve.rerank.cross_encoder import RANDOM_HEAD_MARKER

SHAPES = {"minilm-l2-random": 2, "minilm-l6-random": 6}


def build_test_model(out: Path, layers: int, seed: int = 0) -> Path:
    """Write a random-weight BERT cross-encoder with the MiniLM shape; reuse it if already there."""
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        return out
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=384,
        num_hidden_layers=layers,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
        num_labels=1,
    )
    setattr(config, RANDOM_HEAD_MARKER, True)
    out.mkdir(parents=True, exist_ok=True)
    BertForSequenceClassification(config).eval().save_pretrained(out)
    AutoTokenizer.from_pretrained(resolve_embedder_path("all-MiniLM-L6-v2")).save_pretrained(out)
    return out


def build_all(root: Path) -> dict[str, Path]:
    return {name: build_test_model(root / name, layers) for name, layers in SHAPES.items()}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m tests.rerank.models OUT_DIR")
    for name, path in build_all(Path(sys.argv[1])).items():
        print(f"{name}: {path}")
