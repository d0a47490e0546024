"""The indexer's ONNX int8 embedder at several batch sizes, one run: chunks/s over the same
SciFact chunks, two passes (the first warms up), as many one-thread workers as --threads.

    python benchmarks/bench_batch.py --batches 8,16,32,64,128 --docs 300 --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness import cpu_name, load_avg
from indexer import host_share
from indexer.chunking import Chunker, ChunkingConfig, embedding_text
from indexer.loaders import Document


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=Path("/work/shared/data/scifact/corpus.jsonl"))
    ap.add_argument("--docs", type=int, default=300)
    ap.add_argument("--batches", default="8,16,32,64,128")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    host_share.share_host(0, args.threads, neighbour=0.0)
    from indexer.embedding import load_embedder
    from ragserve.config import EmbedderSettings

    docs = []
    with args.corpus.open() as src:
        for line in src:
            if len(docs) >= args.docs:
                break
            d = json.loads(line)
            docs.append(Document(d["_id"], d["title"], d["text"], "corpus"))
    embedder = load_embedder(EmbedderSettings().model, "onnx", "cpu", True)
    texts = [embedding_text(c) for chunks in Chunker(embedder.tokenizer, ChunkingConfig())(docs) for c in chunks]
    print(f"CPU: {cpu_name()}; load before: {load_avg()}; {len(texts)} chunks, {args.threads} workers", flush=True)
    embedder.embed_documents(texts[:64], 32)
    for rep in range(2):
        for batch in (int(b) for b in args.batches.split(",")):
            started = time.perf_counter()
            embedder.embed_documents(texts, batch)
            rate = len(texts) / (time.perf_counter() - started)
            print(f"pass {rep + 1}, batch {batch}: {rate:.1f} chunks/s", flush=True)
    print(f"load after: {load_avg()}")


if __name__ == "__main__":
    main()
