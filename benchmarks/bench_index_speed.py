"""`ragserve-index build` against a plain sentence-transformers encode of the same model over the
same chunks, in one run: chunks per second of each, and their ratio.

Each configuration is a whole `ragserve-index build` (fresh index root, full build: read, chunk,
embed, graph, BM25, publish, checks) in its own process, timed from the outside (model load
included); chunks/s is the version's chunks over that wall time. The plain encode is
`SentenceTransformer(model).encode(texts)` with its defaults (torch fp32, torch's threads) over the
texts the indexer embedded (the chunks of the first configuration's version, title and text as
the indexer joins them), timed around `encode` alone (model load left out). `--prefix` runs every
process under a command, e.g. `taskset -c 0` for one core.

    python benchmarks/bench_index_speed.py --source /work/shared/data/scifact/corpus.jsonl --max-docs 1000 \\
        --configs 'default=|best=--nice 0 --threads 2 build --backend onnx --batch-size 32'

A configuration is `name=<flags>`: flags before `build` are the indexer's own (--nice, --threads),
the rest are `build`'s.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import cpu_name, load_avg  # noqa: E402

ENCODE = """
import json, sys, time
from sentence_transformers import SentenceTransformer
from ragserve.config import EmbedderSettings
from ragserve.embed.base import resolve_embedder_path
texts = json.load(open(sys.argv[1]))
model = SentenceTransformer(resolve_embedder_path(EmbedderSettings().model), device="cpu")
model.encode(texts[:8])
started = time.perf_counter()
model.encode(texts)
print(json.dumps({"seconds": time.perf_counter() - started, "chunks": len(texts)}))
"""


def subset(source: Path, max_docs: int, into: Path) -> Path:
    """The first `max_docs` documents of a BEIR corpus.jsonl (a folder is used whole)."""
    if source.is_dir() or not max_docs:
        return source
    target = into / "corpus.jsonl"
    with source.open() as src, target.open("w") as dst:
        for n, line in enumerate(src):
            if n >= max_docs:
                break
            dst.write(line)
    return target


def build(name: str, flags: str, source: Path, root: Path, prefix: list[str]) -> dict[str, object]:
    words = shlex.split(flags)
    head, tail = (words[: words.index("build")], words[words.index("build") + 1 :]) if "build" in words else ([], words)
    out = root / name
    command = [*prefix, sys.executable, "-m", "indexer", *head, "build", str(source), "--out", str(out)]
    command.append("--no-progress")
    started = time.perf_counter()
    done = subprocess.run([*command, *tail], capture_output=True, text=True, check=True, cwd=REPO)
    seconds = time.perf_counter() - started
    manifest = json.loads((out / "CURRENT" / "manifest.json").read_text())
    summary = done.stdout.strip().splitlines()[-1]
    return {"name": name, "seconds": seconds, "chunks": manifest["count"], "summary": summary, "root": str(out)}


def chunk_texts(root: Path) -> list[str]:
    from indexer.chunking import embedding_text
    from ragserve.index.chunk_store import read_chunks
    from ragserve.index.format import CHUNKS_FILE

    folder = (root / "CURRENT").resolve()
    return [embedding_text(c) for c in read_chunks(folder / CHUNKS_FILE)]


def plain_encode(texts: list[str], scratch: Path, prefix: list[str]) -> float:
    (scratch / "texts.json").write_text(json.dumps(texts))
    done = subprocess.run(
        [*prefix, sys.executable, "-c", ENCODE, str(scratch / "texts.json")],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return float(result["chunks"]) / float(result["seconds"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, required=True, help="a BEIR corpus.jsonl or a folder of documents")
    ap.add_argument("--max-docs", type=int, default=0, help="the first N documents of a corpus.jsonl (0: all)")
    ap.add_argument("--configs", default="default=", help="name=flags|name=flags (the first is the headline)")
    ap.add_argument("--prefix", default="", help="run every process under this command (taskset -c 0)")
    ap.add_argument("--no-plain", action="store_true", help="skip the plain sentence-transformers encode")
    args = ap.parse_args()
    prefix = shlex.split(args.prefix)
    print(f"CPU: {cpu_name()}; load before: {load_avg()}; prefix: {args.prefix or 'none'}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-index-speed-") as tmp:
        scratch = Path(tmp)
        source = subset(args.source, args.max_docs, scratch)
        runs = []
        for spec in args.configs.split("|"):
            name, _, flags = spec.partition("=")
            run = build(name, flags, source, scratch, prefix)
            runs.append(run)
            rate = float(run["chunks"]) / float(run["seconds"])  # type: ignore[arg-type]
            print(f"{name:>12}: {run['chunks']:,} chunks in {run['seconds']:.1f} s = {rate:.1f} chunks/s  [{flags}]")
            print(f"{'':>14}{run['summary']}", flush=True)
        headline = float(runs[0]["chunks"]) / float(runs[0]["seconds"])  # type: ignore[arg-type]
        # The summary's embedding stage alone (model load, graph and checks left out), as the plain encode is timed.
        stage = float(str(runs[0]["summary"]).partition("embedding ")[2].partition(" chunks/s")[0] or "nan")
        best = max(float(r["chunks"]) / float(r["seconds"]) for r in runs)  # type: ignore[arg-type]
        print(f"headline {runs[0]['name']}: {headline:.1f} chunks/s, {headline / best:.2f} of the best configuration")
        if not args.no_plain:
            plain = plain_encode(chunk_texts(Path(str(runs[0]["root"]))), scratch, prefix)
            print(f"plain sentence-transformers encode: {plain:.1f} chunks/s (encode alone, model load left out)")
            name = runs[0]["name"]
            print(f"ratio {name} / plain: {headline / plain:.2f}x whole build, {stage / plain:.2f}x embedding stage")
    print(f"load after: {load_avg()}")


if __name__ == "__main__":
    main()
