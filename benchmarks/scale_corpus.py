"""Corpora of any size from one real one, for measuring what ragserve costs as its corpus grows.

Each passage joins the leading sentences of one real chunk to the trailing sentences of another
(of a base index built by the real indexer, SciFact by default): real text, real vocabulary,
real sentence structure. Embedding a million passages on two cores takes hours, so a passage's
vector is not the embedding of its text: it is the two source chunks' real vectors mixed in the
share of text each gave, normalized (`RecombinedVectors`). Such vectors sit where real ones do and
serve to measure cost (latency, memory, build and load time, recall against exact search over the
same vectors); retrieval quality is measured only over real embeddings (bench_scale.py, quality).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from tokenizers import Tokenizer

from indexer.chunking import ChunkingConfig
from ragserve.index.chunk_store import read_chunks
from ragserve.index.vector_file import VectorFile
from ragserve.request.sentences import split_sentences

# A passage stays one chunk (at most the indexer's 200 tokens): at ~4.5 characters per word piece
# in this text, 700 characters is ~155.
PASSAGE_CHARS = 700


class SourceChunks:
    """A base index's chunks, split into sentences, with their real vectors."""

    def __init__(self, index_version: Path, exclude_docs: frozenset[str] = frozenset()) -> None:
        """`exclude_docs`: documents whose sentences no passage may hold (judged ones, for quality)."""
        chunks = read_chunks(index_version / "chunks.jsonl")
        self.vectors = np.load(index_version / "vectors.npy").astype(np.float32)
        self.sentences = [split_sentences(c.text) for c in chunks]
        keep = [i for i, s in enumerate(self.sentences) if len(s) >= 2 and chunks[i].doc_id not in exclude_docs]
        self.rows = np.asarray(keep)

    def passages(self, count: int, seed: int) -> Iterator[tuple[str, np.ndarray]]:
        """`count` (text, vector) pairs: head of one chunk + tail of another, vector mixed alike."""
        rng = np.random.default_rng(seed)
        firsts = rng.choice(self.rows, count)
        seconds = rng.choice(self.rows, count)
        for i, j in zip(firsts.tolist(), seconds.tolist(), strict=True):
            head = _leading(self.sentences[i], PASSAGE_CHARS // 2)
            tail = _trailing(self.sentences[j], PASSAGE_CHARS - len(head) - 1)
            text = f"{head} {tail}" if tail else head
            share = len(head) / len(text)
            vector = share * self.vectors[i] + (1.0 - share) * self.vectors[j]
            yield text, vector / np.linalg.norm(vector)


def _leading(sentences: list[str], budget: int) -> str:
    out: list[str] = []
    for s in sentences:
        if out and sum(len(x) + 1 for x in out) + len(s) > budget:
            break
        out.append(s)
    return " ".join(out)[: budget * 2]


def _trailing(sentences: list[str], budget: int) -> str:
    out: list[str] = []
    for s in reversed(sentences[1:]):
        if sum(len(x) + 1 for x in out) + len(s) > budget:
            break
        out.insert(0, s)
    return " ".join(out)


def write_corpus(
    source: SourceChunks, count: int, folder: Path, tokenizer: Any, seed: int = 0, id_prefix: str = "s"
) -> np.ndarray:
    """A BEIR corpus.jsonl of `count` passages in `folder`, each within one chunk of the indexer's
    (passages longer in `tokenizer`'s word pieces are left out); returns their vectors, row i =
    line i."""
    folder.mkdir(parents=True, exist_ok=True)
    vectors = np.empty((count, source.vectors.shape[1]), dtype=np.float32)
    made = source.passages(count * 2, seed)
    n = 0
    with (folder / "corpus.jsonl").open("wb") as out:
        while n < count:
            batch = [next(made) for _ in range(min(4096, 2 * (count - n)))]
            lengths = token_counts(tokenizer, [t for t, _ in batch])
            for (text, vector), length in zip(batch, lengths, strict=True):
                if length <= ChunkingConfig().size_tokens and n < count:
                    out.write(orjson.dumps({"_id": f"{id_prefix}{n}", "title": "", "text": text}) + b"\n")
                    vectors[n] = vector
                    n += 1
    return vectors


def token_counts(tokenizer: Any, texts: list[str]) -> list[int]:
    """Word pieces per text, untruncated: the ONNX embedder's tokenizer is the Rust one
    (`tokenizers.Tokenizer`), the torch one's a Hugging Face tokenizer."""
    if isinstance(tokenizer, Tokenizer):
        whole = Tokenizer.from_str(tokenizer.to_str())
        whole.no_truncation()
        whole.no_padding()
        return [len(e.ids) for e in whole.encode_batch(texts, add_special_tokens=False)]
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


class RecombinedVectors:
    """A fake embedder for the indexer (benchmark only): the recombined vector written beside each
    passage's text, looked up by the text; anything else is an error, never a made-up vector. The
    tokenizer is the real model's, so chunking is the product's."""

    def __init__(
        self, tokenizer: Any, model_id: str, texts: dict[bytes, int], vectors: np.ndarray | VectorFile
    ) -> None:
        self._tokenizer = tokenizer
        self._model_id = model_id
        self._texts = texts
        self._vectors = vectors

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def dim(self) -> int:
        return int(self._vectors.shape[1])

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def embed_documents(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        try:
            rows = [self._texts[_key(t)] for t in texts]
        except KeyError as exc:
            raise RuntimeError(
                f"no recombined vector for a chunk of {len(str(exc))} characters: split passage?"
            ) from exc
        return self._vectors[rows]


def corpus_texts(folder: Path) -> dict[bytes, int]:
    """Each passage's text -> its line (a passage's one chunk is its whole text)."""
    with (folder / "corpus.jsonl").open("rb") as handle:
        return {_key(orjson.loads(line)["text"]): n for n, line in enumerate(handle)}


def _key(text: str) -> bytes:
    """A passage's text as a chunk of it reads (the chunker trims the ends; spacing aside), as a
    digest: a million texts as keys would cost the build's process a gigabyte."""
    return hashlib.blake2b(" ".join(text.split()).encode(), digest_size=16).digest()
