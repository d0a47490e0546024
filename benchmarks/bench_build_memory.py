"""Where an index build's memory goes: RSS (anonymous + file-backed) after each of its steps.

    python benchmarks/bench_build_memory.py --corpus /tmp/scale-after/n100000/add --index COPY_OF_INDEX_ROOT

`--corpus`: a folder of bench_scale.py's (corpus.jsonl and vectors.npy; vectors are looked up as
bench_scale.py does, so embedding costs nothing); `--index`: an index root the build updates (a
copy of the 100,000-chunk root for its +1% build: incremental), or a new one (a full build).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import indexer.build as build  # noqa: E402
from benchmarks.bench_sizing import status_mib  # noqa: E402
from benchmarks.harness import cpu_name, load_avg  # noqa: E402
from ragserve.index.vector_file import VectorFile  # noqa: E402

# (module, attribute) of each step; a step this tree does not have is left out, so one script
# measures the builder before and after a change (copied into the older tree).
STEPS = (
    ("indexer.build", "load_documents"),
    ("indexer.build", "_checked_metadata"),
    ("indexer.build", "scan_source"),
    ("indexer.build", "load_previous"),
    ("indexer.build", "_diff_documents"),
    ("indexer.build", "embed_all"),
    ("indexer.build", "_assemble"),
    ("indexer.build", "_write_rows"),
    ("indexer.version_writer", "VersionWriter.finish"),
    ("indexer.build", "extend_graph"),
    ("indexer.build", "build_hnsw"),
    ("indexer.version_writer", "extend_graph"),
    ("indexer.version_writer", "build_hnsw"),
    ("indexer.build", "write_chunks"),
    ("indexer.build", "build_bm25"),
    ("ragserve.index.bm25_build", "Bm25Builder.finish"),
    ("indexer.build", "_publish_verified"),
)


def rss() -> str:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    anon, file = (int(fields[name].split()[0]) // 1024 for name in ("RssAnon", "RssFile"))
    return f"{anon} anon + {file} file"


def traced(name: str, step: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        before, started = rss(), time.perf_counter()
        out = step(*args, **kwargs)
        # VmHWM: this process's own high-water mark (ru_maxrss may hold a vforking parent's).
        peak, seconds = int(status_mib(os.getpid(), "VmHWM")), time.perf_counter() - started
        print(f"{name:22s} {before:>22s} -> {rss():>22s} MiB, peak {peak:6d} MiB, {seconds:6.1f} s")
        return out

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--index", type=Path, required=True)
    args = parser.parse_args()
    from benchmarks.scale_corpus import RecombinedVectors, corpus_texts
    from indexer.cli import load_embedder
    from ragserve.config import EmbedderSettings, default_of

    real = load_embedder(default_of(EmbedderSettings, "model"), "onnx", "cpu", True)
    # Read a row at a time: a mapped matrix's pages would count in the build's memory.
    vectors = VectorFile(args.corpus / "vectors.npy")
    lookup = RecombinedVectors(real.tokenizer, real.model_id, corpus_texts(args.corpus), vectors)
    for module_name, path in STEPS:
        try:
            owner: Any = importlib.import_module(module_name)
        except ModuleNotFoundError:
            continue
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part, None)
        if getattr(owner, name, None) is not None:
            setattr(owner, name, traced(path, getattr(owner, name)))
    print(f"{cpu_name()}, load {load_avg()}; at the start {rss()} MiB")
    report = build.build_index(args.corpus / "corpus.jsonl", args.index, lookup, progress=False)
    print(f"{report.chunks} chunks, {report.seconds:.1f} s, graph extended: {report.graph_extended}")


if __name__ == "__main__":
    main()
