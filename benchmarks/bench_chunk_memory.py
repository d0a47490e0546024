"""A build's peak memory over documents of a million characters: chunking's tokenizer calls are
bounded by characters (indexer/chunking.py CALL_CHARS), so 256 of them stay within what a build
promises (3 GiB), where one call over 256 documents took ~50 MiB a document (~13 GB).

Each build runs in a child process with the real tokenizer and chunking and an embedder that
makes a vector from each text's hash (embedding is not what is measured); its peak is that
process's own VmHWM. `--call-chars 0` tokenizes up to 256 documents in one call, as before the
bound (mind the memory: keep --docs small with it).

    python benchmarks/bench_chunk_memory.py --docs 256 --chars 1000000
    python benchmarks/bench_chunk_memory.py --docs 16 --chars 1000000 --call-chars 0   # unbounded
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import cpu_name, load_avg  # noqa: E402

LIMIT_MIB = 3 * 1024  # what a build promises (docs/indexing.md, memory)

CHILD = """
import hashlib, json, sys, time
from pathlib import Path
import numpy as np
from transformers import AutoTokenizer
from indexer import chunking, embedding, host_share
from indexer.build import build_index
from indexer.chunking import ChunkingConfig
from ragserve.config import EmbedderSettings
from ragserve.embed.base import resolve_embedder_path
from ragserve.pretrained import load_options

corpus, out, chunk_tokens, call_chars = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if call_chars == 0:
    chunking.CALL_CHARS = embedding.CALL_CHARS = 10**12
elif call_chars > 0:
    chunking.CALL_CHARS = embedding.CALL_CHARS = call_chars
host_share.share_host(None, 0)
path = resolve_embedder_path(EmbedderSettings().model)

class Hashed:
    model_id, dim = "hashed", 32
    tokenizer = AutoTokenizer.from_pretrained(path, **load_options(path))
    def embed_documents(self, texts, batch_size=64):
        rows = [np.frombuffer(hashlib.sha256(t.encode()).digest(), dtype=np.uint8)[:32] for t in texts]
        m = np.asarray(rows, dtype=np.float32).reshape(-1, 32) + 1.0
        return m / np.linalg.norm(m, axis=1, keepdims=True)

started = time.perf_counter()
chunks = ChunkingConfig(chunk_tokens, min(40, chunk_tokens // 5))
report = build_index(Path(corpus), Path(out), Hashed(), chunks, progress=False)
status = open("/proc/self/status").read().splitlines()
peak = int(next(x for x in status if x.startswith("VmHWM:")).split()[1]) / 1024
print(json.dumps({"peak_mib": peak, "seconds": time.perf_counter() - started, "chunks": report.chunks,
                  "stages": report.stage_seconds}))
"""


def write_corpus(target: Path, docs: int, chars: int, prose: Path) -> None:
    """`docs` documents of `chars` characters: SciFact's abstracts run together from a different
    place for each document (random words where that corpus is missing: slower to tokenize)."""
    if prose.is_file():
        with prose.open() as src:
            text = " ".join(json.loads(line)["text"] for line in src)
    else:
        rng = random.Random(7)
        words = [
            "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 11))) for _ in range(20_000)
        ]
        text = " ".join(rng.choice(words) for _ in range(400_000))
    with target.open("w") as out:
        for i in range(docs):
            start = (i * 7919) % len(text)
            body = (text[start:] + " " + text) * (chars // len(text) + 1)
            out.write(json.dumps({"_id": f"d{i}", "title": f"Document {i}", "text": body[:chars]}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=256)
    ap.add_argument("--chars", type=int, default=1_000_000)
    ap.add_argument("--chunk-tokens", type=int, default=200)
    ap.add_argument("--call-chars", type=int, default=-1, help="-1: the indexer's bound; 0: unbounded (as before)")
    ap.add_argument("--prose", type=Path, default=Path("/work/shared/data/scifact/corpus.jsonl"))
    args = ap.parse_args()
    print(f"CPU: {cpu_name()}; load before: {load_avg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-chunk-memory-") as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        started = time.perf_counter()
        write_corpus(corpus, args.docs, args.chars, args.prose)
        print(f"corpus: {args.docs} documents of {args.chars:,} characters ({time.perf_counter() - started:.0f} s)")
        command = [sys.executable, "-c", CHILD, str(corpus), str(Path(tmp) / "index")]
        done = subprocess.run(
            [*command, str(args.chunk_tokens), str(args.call_chars)],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        )
        result = json.loads(done.stdout.strip().splitlines()[-1])
    stages = ", ".join(f"{k} {v:.0f} s" for k, v in result["stages"].items())
    print(
        f"build: {result['chunks']:,} chunks in {result['seconds']:.0f} s ({stages}); "
        f"peak RSS (VmHWM) {result['peak_mib']:,.0f} MiB against {LIMIT_MIB:,} MiB"
    )
    print(f"load after: {load_avg()}")
    if result["peak_mib"] > LIMIT_MIB:
        raise SystemExit(f"over the limit: {result['peak_mib']:,.0f} MiB > {LIMIT_MIB:,} MiB")


if __name__ == "__main__":
    main()
