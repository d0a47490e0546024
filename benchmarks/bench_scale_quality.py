"""Retrieval quality among real distractors, and the evidence stage's cost per index format.

    python benchmarks/bench_scale_quality.py quality --base-index IDX --data ../shared/data/scifact \
        --work /tmp/bench-scale-quality --distractors 100000
    python benchmarks/bench_scale_quality.py evidence --index FORMAT_1_ROOT --work DIR

`quality`: SciFact's queries against its corpus alone, and against its corpus hidden among
`--distractors` passages recombined from the sentences of SciFact documents no query judges
(benchmarks/scale_corpus.py), every passage embedded for real by the indexer (ONNX int8). The
mixed index is built incrementally on SciFact's, so SciFact's passages carry the same vectors in
both and only the distractors are embedded again. One retrieval-only server per index (hybrid, no
reranker, no cache), Retrieve top_k 100 with documents deduplicated, nDCG@10 and recall@100 of
each, one run.

`evidence`: the evidence stage's server time (StageTimings.evidence_ms) at top_k 100 and 10,
SciFact queries, each a first visit (a fresh process per index and top_k), over a format 1 index
(its chunks' sentences analysed when a request first touches them) and over a copy of it whose
docstore stores them as format 2 does (analysed once, at build time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_scale import embedder_tokenizer  # noqa: E402
from benchmarks.harness import cpu_name, git_head, load_avg, percentile  # noqa: E402
from benchmarks.workloads import Server, evaluate, load_qrels, load_queries  # noqa: E402

# --- quality --------------------------------------------------------------------------------------


def quality(args: argparse.Namespace) -> dict[str, Any]:
    """SciFact alone and among real distractors: two indexes by the real indexer, one server each."""
    from benchmarks.bench_quality import retrieve_all
    from benchmarks.scale_corpus import SourceChunks, write_corpus

    qrels = load_qrels(args.data)
    judged = frozenset(doc for rels in qrels.values() for doc in rels)
    mixed = args.work / f"scifact+{args.distractors}"
    if not (mixed / "corpus.jsonl").is_file():
        source = SourceChunks(args.base_index, exclude_docs=judged)
        write_corpus(source, args.distractors, mixed, embedder_tokenizer(), seed=7, id_prefix="d")
        with (mixed / "corpus.jsonl").open("ab") as out:
            out.write((args.data / "corpus.jsonl").read_bytes())
    results: dict[str, Any] = {}
    for name, corpus in (("SciFact alone", args.data), (f"among {args.distractors:,} distractors", mixed)):
        index = args.work / f"quality-{'alone' if corpus == args.data else 'mixed'}"
        if results and not index.exists():
            # An incremental build on SciFact alone: its passages keep their vectors (identical in
            # both indexes) and only the distractors are embedded.
            shutil.copytree(args.work / "quality-alone", index, symlinks=True)
        started = time.perf_counter()
        subprocess.run(
            # The whole host: not the defaults for building beside a serving sidecar (nice 10, a core left).
            [
                sys.executable,
                "-m",
                "indexer",
                "--nice",
                "0",
                "--threads",
                str(os.cpu_count() or 1),
                "build",
                str(corpus / "corpus.jsonl"),
                "--out",
                str(index),
                "--no-progress",
            ],
            check=True,
            cwd=REPO,
        )
        built = time.perf_counter() - started
        server = Server(index, {"RAGSERVE_RERANK_MODE": "off"}, args.work / f"quality-{len(results)}.log")
        asyncio.run(server.wait_ready(900))
        queries = load_queries(args.data)
        runs = asyncio.run(retrieve_all(server.target, queries, 100, 2))
        server.stop()
        chunks = json.loads(((index / "CURRENT").resolve() / "manifest.json").read_text())["count"]
        results[name] = {**evaluate(runs, qrels, list(queries)), "chunks": chunks, "build_s": built}
        print(f"{name}: {results[name]}; load {load_avg()}", flush=True)
    return results


# --- evidence ---------------------------------------------------------------------------------


def evidence_one(index: Path, data: Path, top_k: int, count: int) -> None:
    """Subprocess body (a fresh process: no chunk analysed before): the server's pipeline in process,
    SciFact queries at `top_k`, each a first visit; prints the evidence stage's ms as JSON."""
    from ragserve.budget import Deadline, RequestContext
    from ragserve.config import AnswerSettings, CacheSettings, IndexSettings, RerankSettings, Settings
    from ragserve.factory import make_pipeline
    from ragserve.types import RetrieveParams

    settings = Settings(
        index=IndexSettings(path=index),
        answer=AnswerSettings(generation_enabled=False),
        cache=CacheSettings(backend="off"),
        rerank=RerankSettings(mode="off"),
    )

    async def run() -> dict[str, list[float]]:
        pipeline = make_pipeline(settings, with_generator=False)
        out: dict[str, list[float]] = {"evidence": [], "search": [], "retrieval total": []}
        async with pipeline:
            for text in list(load_queries(data).values())[:count]:
                result = await pipeline.retrieve(RetrieveParams(text, top_k, 10_000), RequestContext(Deadline(10_000)))
                out["evidence"].append(result.timings.evidence_ms)
                out["search"].append(result.timings.search_ms)  # decodes the chunks, stored sentences too
                out["retrieval total"].append(result.timings.retrieval_total_ms)
        return out

    times = asyncio.run(run())
    print(json.dumps({f"{k} p50/p95 ms": (percentile(v, 50), percentile(v, 95)) for k, v in times.items()}))


def with_stored_sentences(root: Path, out: Path) -> Path:
    """A copy of `root`'s published format 1 version whose docstore stores each chunk's sentences as
    the format 2 indexer does; nothing else differs (same chunks, vectors and graph)."""
    import shutil

    from ragserve.digests import sha256_file
    from ragserve.index.chunk_store import read_chunks, write_chunks
    from ragserve.index.format import CHUNKS_FILE, CURRENT, MANIFEST
    from ragserve.request.sentences import analyse_text

    source = (root / CURRENT).resolve()
    shutil.rmtree(out, ignore_errors=True)
    version = out / source.name
    shutil.copytree(source, version)
    write_chunks(version / CHUNKS_FILE, read_chunks(source / CHUNKS_FILE), analyse_text)
    manifest = json.loads((version / MANIFEST).read_text())
    manifest["files"][CHUNKS_FILE] = sha256_file(version / CHUNKS_FILE)
    manifest["format"] = 2
    (version / MANIFEST).write_text(json.dumps(manifest))
    (out / CURRENT).symlink_to(version.name)
    return out


def evidence(args: argparse.Namespace) -> dict[str, Any]:
    """The evidence stage at top_k 100 and 10 over a format 1 index and its copy with stored
    sentences, in turn, one fresh process each."""
    results: dict[str, Any] = {}
    for index in (str(args.index), str(with_stored_sentences(args.index, args.work / "format-2"))):
        version = (Path(index) / "CURRENT").resolve()
        form = json.loads((version / "manifest.json").read_text()).get("format")
        for top_k in (100, 10):
            command = [sys.executable, __file__, "evidence-one", index, str(args.data), str(top_k), str(args.queries)]
            run = subprocess.run(command, capture_output=True, text=True, cwd=REPO, check=True)
            results[f"{index} (format {form}), top_k {top_k}"] = json.loads(run.stdout.strip().splitlines()[-1])
            print(list(results.items())[-1], flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("evidence-one")
    for name, kind in (("index", Path), ("data", Path), ("top_k", int), ("count", int)):
        one.add_argument(name, type=kind)
    for name in ("quality", "evidence"):
        p = sub.add_parser(name)
        p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
        p.add_argument("--work", type=Path, required=True)
        p.add_argument("--queries", type=int, default=300)
    sub.choices["quality"].add_argument("--base-index", type=Path, required=True, help="a SciFact index root")
    sub.choices["quality"].add_argument("--distractors", type=int, default=100_000)
    sub.choices["evidence"].add_argument("--index", type=Path, required=True, help="a format 1 index root")
    args = parser.parse_args()
    if args.command == "evidence-one":
        evidence_one(args.index, args.data, args.top_k, args.count)
        return
    args.work.mkdir(parents=True, exist_ok=True)
    header = f"{cpu_name()}, commit {git_head()}, load at start {load_avg()}"
    if args.command == "quality":
        if (args.base_index / "CURRENT").exists():
            args.base_index = (args.base_index / "CURRENT").resolve()
        results = quality(args)
    else:
        results = evidence(args)
    text = header + "\n\n" + "\n".join(f"- {k}: {v}" for k, v in results.items()) + f"\n\nload at end {load_avg()}\n"
    (args.work / f"{args.command}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
