"""Chunking's tokenizer calls are bounded by characters, not by documents: a call holds at most
CALL_CHARS, and a longer document is tokenized in pieces cut at whitespace, into the same chunks
as in one piece."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import AutoTokenizer

from indexer import chunking
from indexer.chunking import Chunker, ChunkingConfig
from indexer.loaders import Document
from ragserve.config import EmbedderSettings
from ragserve.embed.base import resolve_embedder_path
from ragserve.pretrained import load_options


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    path = resolve_embedder_path(EmbedderSettings().model)
    return AutoTokenizer.from_pretrained(path, **load_options(path))


def _doc(i: int, words: int) -> Document:
    text = " ".join(f"word{i}x{j % 97}, naïve\ncafé" if j % 7 == 0 else f"w{j % 13}" for j in range(words))
    return Document(doc_id=f"d{i}", title=f"T{i}", text=text, source=f"d{i}.txt")


def _cut(docs: list[list[Any]]) -> list[list[tuple[str, int, int, str]]]:
    return [[(c.chunk_id, c.start, c.end, c.text) for c in chunks] for chunks in docs]


def test_calls_hold_at_most_call_chars(tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = [_doc(i, 300) for i in range(12)] + [_doc(99, 4000)]  # the last is longer than a call
    config = ChunkingConfig(50, 10)
    whole = Chunker(tokenizer, config)(docs)
    monkeypatch.setattr(chunking, "CALL_CHARS", 5000)
    calls: list[int] = []
    tokenize = Chunker._tokenize

    def counted(self: Chunker, batch: list[tuple[int, int, str]], spans: Any) -> None:
        calls.append(sum(len(text) for _, _, text in batch))
        tokenize(self, batch, spans)

    monkeypatch.setattr(Chunker, "_tokenize", counted)
    bounded = Chunker(tokenizer, config)(docs)
    assert max(calls) <= 5000 and len(calls) >= 6
    assert _cut(bounded) == _cut(whole)
    assert bounded[-1][-1].end == len(docs[-1].text)


def test_a_piece_without_whitespace_is_cut_at_the_bound() -> None:
    assert chunking._pieces("a" * 25, 10) == [(0, "a" * 10), (10, "a" * 10), (20, "a" * 5)]
    assert chunking._pieces("ab cd ef", 4) == [(0, "ab"), (2, " cd"), (5, " ef")]
