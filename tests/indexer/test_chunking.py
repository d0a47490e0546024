"""Chunking many documents with one tokenizer call cuts the same windows as one call per document,
whatever the embedder sharing the tokenizer set on it."""

from __future__ import annotations

from indexer.chunking import ChunkingConfig, chunk_documents
from indexer.loaders import Document
from ragserve.embed.torch_backend import SentenceTransformerEmbedder

CONFIG = ChunkingConfig(size_tokens=24, overlap_tokens=6)


def _docs() -> list[Document]:
    words = "Tides follow the moon; yeast leavens bread. Naïve café owners say: 3.5% of días — fine!"
    return [
        Document(f"d{i}", f"Title {i}", " ".join([words] * (i % 5)), f"d{i}.txt")  # the first is empty: its title
        for i in range(12)
    ]


def _one_call_each(doc: Document, tokenizer: object) -> list[tuple[str, int, int]]:
    """The windows as chunking cut them before it was batched: one tokenizer call on one text."""
    body = doc.text if doc.text.strip() else doc.title
    offsets = tokenizer(body, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]  # type: ignore[operator]
    windows, start = [], 0
    while offsets:
        window = offsets[start : start + CONFIG.size_tokens]
        windows.append((body[window[0][0] : window[-1][1]], window[0][0], window[-1][1]))
        if start + CONFIG.size_tokens >= len(offsets):
            break
        start += CONFIG.size_tokens - CONFIG.overlap_tokens
    return windows


def test_one_batched_call_cuts_what_one_call_per_document_cuts(embedder: SentenceTransformerEmbedder) -> None:
    docs = [*_docs(), Document("long", "Long", " ".join(f"word{i} and more" for i in range(400)), "long.txt")]
    embedder.embed_documents(["the embedder leaves its tokenizer truncating at the model's length"])
    batched = chunk_documents(docs, embedder.tokenizer, CONFIG)
    assert batched[-1][-1].end == len(docs[-1].text)  # past 256 tokens: not truncated
    assert len(batched) == len(docs)
    for doc, chunks in zip(docs, batched, strict=True):
        assert [(c.text, c.start, c.end) for c in chunks] == _one_call_each(doc, embedder.tokenizer)
        assert [c.chunk_id for c in chunks] == [f"{doc.doc_id}#{n}" for n in range(len(chunks))]
    assert sum(len(c) > 1 for c in batched) > 3  # documents long enough to need several windows
    assert chunk_documents([], embedder.tokenizer, CONFIG) == []
