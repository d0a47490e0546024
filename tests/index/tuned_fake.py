"""A tiny random BERT saved as a sentence-transformers model (MiniLM's tokenizer, 1 layer): a fake
"tuned" bi-encoder that exports to ONNX in seconds. Its vectors mean nothing; it is for format,
publish and reload tests only."""

from __future__ import annotations

from pathlib import Path

from ragserve.config import DEFAULT_EMBEDDER
from ragserve.embed.base import resolve_embedder_path


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
