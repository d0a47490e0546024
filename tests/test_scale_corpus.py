"""The scale benchmark's corpus maker counts word pieces with either kind of tokenizer an embedder
holds (benchmarks/scale_corpus.py): a passage past the chunk size is never written as one chunk."""

from __future__ import annotations

from tokenizers import Tokenizer

from benchmarks.scale_corpus import token_counts
from ragserve.embed.torch_backend import SentenceTransformerEmbedder


def test_the_rust_and_the_hugging_face_tokenizer_count_alike_and_untruncated(
    embedder: SentenceTransformerEmbedder,
) -> None:
    hugging_face = embedder.tokenizer
    rust = Tokenizer.from_str(hugging_face.backend_tokenizer.to_str())
    rust.enable_truncation(128)  # as an embedder's own may be set: the count must not stop there
    texts = ["Bees dance to tell the hive where flowers are.", " ".join(["pollen"] * 400)]
    counts = token_counts(rust, texts)
    assert counts == token_counts(hugging_face, texts)
    assert counts[1] > 300
