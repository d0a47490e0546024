"""Embedding throughput (chunks/s) of the torch embedder on one device: the path the indexer takes
with `--backend torch --device cpu|cuda`.

The corpus is a BEIR-style corpus.jsonl (gzip when the name ends in .gz). Its documents are cut
into chunks by the indexer's own chunker (indexer/chunking.py, default 200/40 tokens, in the
model's tokens) and embedded as the indexer embeds them (`embedding_text`: title + chunk text),
in groups of `--group` chunks, each group one `SentenceTransformerEmbedder.embed_documents(group,
batch_size=B)` call, as indexer/embedding.py does. Per batch size: one untimed warm-up group,
then every group, timed on the wall clock (CUDA synchronised). One JSON line per batch size.

    python benchmarks/bench_embed_device.py --corpus data/scifact/corpus.jsonl --device cuda \
        --batch-sizes 64,256,512

The tokenizer alone (no model run), the way sentence-transformers tokenizes each batch, to see
whether tokenizing bounds throughput on a host (`taskset -c 0` for one core):

    taskset -c 0 python benchmarks/bench_embed_device.py --corpus corpus.jsonl.gz --tokenize-only
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import cpu_name
from indexer.chunking import ChunkingConfig, chunk_document, embedding_text
from indexer.loaders import Document
from ragserve.config import EmbedderSettings, default_of


def open_text(path: Path) -> IO[str]:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def iter_documents(path: Path) -> Iterator[Document]:
    with open_text(path) as fh:
        for n, line in enumerate(fh):
            if not line.strip():
                continue
            record = json.loads(line)
            doc_id = str(record.get("_id", n))
            yield Document(doc_id, str(record.get("title") or ""), str(record.get("text") or ""), path.name)


def load_texts(path: Path, tokenizer: Any, limit: int) -> tuple[list[str], int]:
    """The chunk texts the indexer would embed, at most `limit` (0: all); and the documents read."""
    config = ChunkingConfig()
    texts: list[str] = []
    docs = 0
    for doc in iter_documents(path):
        docs += 1
        texts.extend(embedding_text(chunk) for chunk in chunk_document(doc, tokenizer, config))
        if limit and len(texts) >= limit:
            return texts[:limit], docs
    return texts, docs


def max_length(model: Any) -> int:
    return int(model.max_seq_length or model.tokenizer.model_max_length)


def mean_tokens(tokenizer: Any, texts: list[str], max_len: int) -> float:
    """Tokens per text as the model sees them: specials included, cut at the model's max_seq_length."""
    ids = tokenizer(texts, truncation=True, max_length=max_len)["input_ids"]
    return sum(len(row) for row in ids) / max(1, len(ids))


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return str(torch.cuda.get_device_name())
    return cpu_name()


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def groups(texts: list[str], size: int) -> list[list[str]]:
    return [texts[i : i + size] for i in range(0, len(texts), size)]


def time_embedding(embedder: Any, texts: list[str], batch: int, group: int, device: str) -> tuple[float, float]:
    """(warm-up seconds, timed seconds) of embedding every text in groups, `batch` per model call."""
    parts = groups(texts, group)
    synchronize(device)
    start = time.perf_counter()
    embedder.embed_documents(parts[0], batch_size=batch)
    synchronize(device)
    warmup = time.perf_counter() - start
    start = time.perf_counter()
    rows = 0
    for part in parts:
        rows += len(embedder.embed_documents(part, batch_size=batch))
    synchronize(device)
    elapsed = time.perf_counter() - start
    if rows != len(texts):
        raise RuntimeError(f"embedded {rows} rows for {len(texts)} texts")
    return warmup, elapsed


def time_tokenizing(model: Any, texts: list[str], batch: int, group: int) -> float:
    """Seconds to tokenize every text as sentence-transformers does per batch (sorted by length
    within each group, padded, cut at max_seq_length, torch tensors), without running the model."""
    tokenizer = model.tokenizer
    max_len = max_length(model)
    start = time.perf_counter()
    for part in groups(texts, group):
        ordered = sorted(part, key=len, reverse=True)
        for i in range(0, len(ordered), batch):
            tokenizer(
                ordered[i : i + batch],
                padding=True,
                truncation="longest_first",
                max_length=max_len,
                return_tensors="pt",
            )
    return time.perf_counter() - start


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, required=True, help="BEIR corpus.jsonl (.gz allowed)")
    p.add_argument("--model", default=default_of(EmbedderSettings, "model"), help="name or local folder")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--batch-sizes", default="64,256,512", help="comma list of batch sizes")
    p.add_argument("--limit", type=int, default=0, help="at most this many chunks (0: all)")
    p.add_argument("--group", type=int, default=1024, help="chunks per embed_documents call (indexer: 1024)")
    p.add_argument("--tokenize-only", action="store_true", help="time the tokenizer alone, no model run")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import sentence_transformers
    import torch

    from ragserve.embed.torch_backend import SentenceTransformerEmbedder

    start = time.perf_counter()
    embedder = SentenceTransformerEmbedder(args.model, device=args.device)
    model = embedder._model  # the SentenceTransformer: its max_seq_length (what encode cuts at)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    texts, docs = load_texts(args.corpus, embedder.tokenizer, args.limit)
    chunk_s = time.perf_counter() - start
    if not texts:
        raise SystemExit(f"no texts in {args.corpus}")
    common = {
        "device": args.device,
        "device_name": device_name("cpu" if args.tokenize_only else args.device),
        "model": args.model,
        "documents": docs,
        "texts": len(texts),
        "mean_tokens": round(mean_tokens(embedder.tokenizer, texts, max_length(model)), 1),
        "max_seq_length": max_length(model),
        "group": args.group,
        "torch": torch.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "load_s": round(load_s, 2),
        "chunking_s": round(chunk_s, 2),
    }
    for batch in (int(b) for b in args.batch_sizes.split(",") if b.strip()):
        row: dict[str, Any] = {"batch_size": batch, **common}
        if args.tokenize_only:
            seconds = time_tokenizing(model, texts, batch, args.group)
            row.update(mode="tokenize-only", seconds=round(seconds, 3), texts_per_s=round(len(texts) / seconds, 1))
        else:
            warmup, seconds = time_embedding(embedder, texts, batch, args.group, args.device)
            row.update(mode="embed", warmup_s=round(warmup, 3), seconds=round(seconds, 3))
            row["chunks_per_s"] = round(len(texts) / seconds, 1)
            if args.device.startswith("cuda"):
                row["max_gpu_mem_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
