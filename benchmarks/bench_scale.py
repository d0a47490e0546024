"""What a sidecar costs as its corpus grows: 10 thousand to a million chunks, on this host.

    python benchmarks/bench_scale.py run --base-index IDX --data ../shared/data/scifact \
        --work /tmp/bench-scale --sizes 10000,100000,1000000

`run`, per size: a corpus recombined from the base index's real chunks (benchmarks/scale_corpus.py:
real text; vectors are the source chunks' real vectors mixed, not the texts' embeddings), built by
the real indexer (`build_index`, the embedder replaced by that lookup, so the time is everything
but embedding: bench_embed.py measures that); then HNSW recall@10 against exact search over the
same vectors for SciFact's real query embeddings; then retrieval-only `ragserve serve` processes
(no cache): seconds to SERVING, RSS at SERVING and after load, Retrieve p50/p99 (top_k 10, one
request at a time) for dense, lexical and hybrid without a reranker and hybrid with the two test
tiers; then, with load running, a hot reload to a version with 1% more documents (the indexer's
incremental build, timed; from --copy-reload-from chunks up, a copy of the version instead, where
that build does not fit in memory beside the server): peak RSS and the p99 and longest request
while it loads. Disk per version.
Retrieval quality at scale and the evidence stage's cost: bench_scale_quality.py.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_sizing import memory_and_helpers, status_mib, tree_rss_mib  # noqa: E402
from benchmarks.harness import cpu_name, git_head, load_avg, percentile  # noqa: E402
from benchmarks.reload_phases import PHASES, reload_under_load  # noqa: E402
from benchmarks.workloads import Server, load_queries  # noqa: E402
from ragserve.client import RagClient  # noqa: E402
from ragserve.config import EmbedderSettings, default_of  # noqa: E402

SERVER_ENV = {"RAGSERVE_RERANK_MODE": "off", "RAGSERVE_RETRIEVAL_BUDGET_MS": "70"}
# (name, settings): the Retrieve layouts timed at each size.
LAYOUTS = [
    ("dense", {"RAGSERVE_RETRIEVAL_MODE": "dense"}),
    ("lexical", {"RAGSERVE_RETRIEVAL_MODE": "bm25"}),
    ("hybrid", {"RAGSERVE_RETRIEVAL_MODE": "hybrid"}),
    ("hybrid + two tiers", {"RAGSERVE_RETRIEVAL_MODE": "hybrid", "RAGSERVE_RERANK_MODE": "two-tier"}),
]
ADD_SHARE = 0.01


def embedder_tokenizer() -> Any:
    from indexer.cli import load_embedder

    return load_embedder(default_of(EmbedderSettings, "model"), "onnx", "cpu", True).tokenizer


# --- building -------------------------------------------------------------------------------------


def build_one(corpus: Path, index: Path, vectors: Path) -> None:
    """Subprocess body: the real indexer over `corpus`, vectors looked up; prints a JSON report."""
    from benchmarks.scale_corpus import RecombinedVectors, corpus_texts
    from indexer import host_share
    from indexer.build import build_index
    from indexer.cli import load_embedder
    from ragserve.index.vector_file import VectorFile

    host_share.share_host(None, 0)  # as `ragserve-index build` runs by default (measured)
    real = load_embedder(default_of(EmbedderSettings, "model"), "onnx", "cpu", True)
    # Rows read as looked up: a mapped matrix's pages would count in the build's peak RSS.
    fake = RecombinedVectors(real.tokenizer, real.model_id, corpus_texts(corpus), VectorFile(vectors))
    started = time.perf_counter()
    report = build_index(corpus / "corpus.jsonl", index, fake, progress=False, embedder_backend="onnx-int8")
    seconds = time.perf_counter() - started
    # VmHWM, not ru_maxrss: a child started by vfork (Python's subprocess) folds its parent's
    # high-water mark into its own ru_maxrss at exec, so that figure can be the parent's.
    peak = status_mib(os.getpid(), "VmHWM")
    out = {
        "seconds": seconds,
        "chunks": report.chunks,
        "embedded": report.embedded,
        "published": report.published,
        "graph_extended": getattr(report, "graph_extended", False),  # older trees have no such field
        "peak_rss_mib": peak,
    }
    print(json.dumps(out))


def timed_build(corpus: Path, index: Path, vectors: Path) -> dict[str, Any]:
    command = [sys.executable, __file__, "build-one", str(corpus), str(index), str(vectors)]
    run = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if run.returncode:
        raise SystemExit(f"build failed:\n{run.stderr[-3000:]}")
    return dict(json.loads(run.stdout.strip().splitlines()[-1]))


def make_corpus(base: Path, size: int, folder: Path) -> None:
    """corpus.jsonl + vectors.npy of `size` passages, and `add/` with 1% more (same seed: a superset)."""
    from benchmarks.scale_corpus import SourceChunks, write_corpus

    if (folder / "vectors.npy").is_file():
        return
    source = SourceChunks(base)
    extra = int(size * ADD_SHARE)
    vectors = write_corpus(source, size + extra, folder / "add", embedder_tokenizer(), seed=size)
    lines = (folder / "add" / "corpus.jsonl").read_bytes().splitlines(keepends=True)
    (folder / "corpus.jsonl").write_bytes(b"".join(lines[:size]))
    np.save(folder / "vectors.npy", vectors[:size])
    np.save(folder / "add" / "vectors.npy", vectors)


# --- recall ---------------------------------------------------------------------------------------


def query_vectors(data: Path, limit: int) -> np.ndarray:
    from indexer.cli import load_embedder

    queries = list(load_queries(data).values())[:limit]
    embedder: Any = load_embedder(default_of(EmbedderSettings, "model"), "onnx", "cpu", True)
    return np.asarray(embedder.embed_queries(queries), dtype=np.float32)


def recall_at_10(index_root: Path, queries: np.ndarray, efs: list[int]) -> dict[str, float]:
    """HNSW top 10 against an exact search over the version's own vectors, per ef, and at the ef a
    server searches it with for top_k 10 (the setting's 64, or the breadth the version measured)."""
    from ragserve.index import hnsw, hnsw_build

    index = hnsw.HnswIndex.load(index_root)
    served = max(64, int(index.manifest.hnsw.get("ef_search", 0)))
    efs = sorted({*efs, served})
    best = hnsw_build.exact_top(queries, np.load(index.folder / "vectors.npy", mmap_mode="r"), 10)
    out: dict[str, float] = {}
    for ef in efs:
        hits = 0
        for q, truth in zip(queries, best, strict=True):
            # Passage n is one chunk, "s<n>#0", at row n (rows follow the corpus's order).
            rows = {int(s.chunk.doc_id[1:]) for s in index.search(q, 10, ef)}
            hits += sum(1 for row in truth if int(row) in rows)
        out[f"ef {ef}{' (served)' if ef == served else ''}"] = hits / (10 * len(queries))
    return out


# --- serving --------------------------------------------------------------------------------------


async def timed_retrieves(target: str, queries: list[str]) -> list[float]:
    async with RagClient(target, default_timeout_s=30) as client:
        for q in queries[:5]:
            await client.retrieve(q, top_k=10)  # first calls load lazy parts
        times = []
        for q in queries:
            started = time.perf_counter()
            await client.retrieve(q, top_k=10)
            times.append((time.perf_counter() - started) * 1000)
    return times


def tier_env(work: Path) -> dict[str, str]:
    """The test tiers: random-weight cross-encoders with the MiniLM shapes (benchmarks/workloads.py)."""
    from benchmarks.workloads import build_all

    models = build_all(work / "tiers")
    return {
        "RAGSERVE_RERANK_TIER1_MODEL": str(models["minilm-l2-random"]),
        "RAGSERVE_RERANK_TIER2_MODEL": str(models["minilm-l6-random"]),
        "RAGSERVE_RERANK_ALLOW_RANDOM_HEADS": "true",
        "RAGSERVE_RERANK_ONNX_CACHE_DIR": str(work / "tiers" / "onnx"),
    }


def serve_layouts(index: Path, queries: list[str], work: Path, only: list[str] | None = None) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    tiers = tier_env(work.parent)
    for name, env in LAYOUTS:
        if only and name not in only:
            continue
        server = Server(index, {**SERVER_ENV, **tiers, **env}, work / f"server-{name.replace(' ', '_')}.log")
        started = time.perf_counter()
        asyncio.run(server.wait_ready(900))
        to_serving = time.perf_counter() - started
        rss_serving, anon_serving = tree_rss_mib(server.proc.pid), anon_mib(server.proc.pid)
        times = asyncio.run(timed_retrieves(server.target, queries))
        rows[name] = {
            "to_serving_s": to_serving,
            "rss_serving_mib": rss_serving,
            "rss_after_mib": tree_rss_mib(server.proc.pid),
            # RSS counts the mapped docstore's and vectors' pages too (file-backed, reclaimable):
            # anonymous memory is what the server itself holds.
            "anon_serving_mib": anon_serving,
            "anon_after_mib": anon_mib(server.proc.pid),
            "p50_ms": percentile(times, 50),
            "p99_ms": percentile(times, 99),
        }
        server.stop()
    return rows


def anon_mib(pid: int) -> float:
    """RssAnon of the server process and its children (a big version's graph helper)."""
    return tree_rss_mib(pid, "RssAnon")


class RssPeak:
    """The highest RSS of a process tree, sampled every 50 ms on a thread."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, tree_rss_mib(self.pid))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak


def republish(index: Path) -> dict[str, Any]:
    """The current version's files copied and published as the next version: a reload of the same
    size where the +1% build does not fit in memory beside the server (--copy-reload-from)."""
    import dataclasses

    from ragserve.index.format import MANIFEST, new_build_dir, publish, read_verified_manifest, resolve_current

    started = time.perf_counter()
    folder = resolve_current(index)
    manifest = read_verified_manifest(folder)
    build = new_build_dir(index)
    shutil.copytree(folder, build, dirs_exist_ok=True, ignore=lambda _dir, names: [n for n in names if n == MANIFEST])
    publish(index, build, dataclasses.replace(manifest, version=manifest.version + 1))
    return {"seconds": time.perf_counter() - started, "chunks": manifest.count, "published": True, "copied": True}


def disk_mib(index: Path) -> float:
    folder = (index / "CURRENT").resolve()
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / (1 << 20)


def measure_size(args: argparse.Namespace, size: int, queries: list[str], qvecs: np.ndarray) -> dict[str, Any]:
    folder = args.work / f"n{size}"
    started = time.perf_counter()
    make_corpus(args.base_index, size, folder)
    print(f"[{size}] corpus in {time.perf_counter() - started:.0f} s; load {load_avg()}", flush=True)
    index = folder / "index"
    if (index / "CURRENT").exists() and json.loads((index / "CURRENT" / "manifest.json").read_text())["count"] != size:
        shutil.rmtree(index)  # a run stopped after its +1% version: start from the base corpus again
    if not (index / "CURRENT").exists():
        row: dict[str, Any] = {"build": timed_build(folder, index, folder / "vectors.npy")}
    else:
        row = {"build": json.loads((folder / "build.json").read_text())}
    (folder / "build.json").write_text(json.dumps(row["build"]))
    print(f"[{size}] build {row['build']}; load {load_avg()}", flush=True)
    if args.build_only:
        return row
    row["disk_mib"] = disk_mib(index)
    row["recall@10"] = recall_at_10(index, qvecs, args.efs)
    print(f"[{size}] recall {row['recall@10']}", flush=True)
    row["layouts"] = serve_layouts(index, queries, folder, args.layouts)
    print(f"[{size}] layouts {row['layouts']}; load {load_avg()}", flush=True)
    env = {**SERVER_ENV, "RAGSERVE_INDEX_RELOAD_INTERVAL_S": "1"}
    server = Server(index, env, folder / "server-reload.log")
    asyncio.run(server.wait_ready(900))
    copies = bool(args.copy_reload_from and size >= args.copy_reload_from)
    runs = [reload_once(server, queries, index, folder, copies) for _ in range(args.reload_repeats if copies else 1)]
    server.stop()
    row["reload"], row["reload_repeats"] = runs[0], runs[1:]
    return row


def reload_once(server: Server, queries: list[str], index: Path, folder: Path, copies: bool) -> dict[str, Any]:
    """One hot reload under load: to a copy of the version, or to the +1% build."""
    pid = server.proc.pid
    peak = RssPeak(pid)
    add = folder / "add"
    publish = (lambda: republish(index)) if copies else (lambda: timed_build(add, index, add / "vectors.npy"))
    sample = functools.partial(memory_and_helpers, pid)
    run = asyncio.run(reload_under_load(server.target, queries, index, publish, sample))
    run["peak_rss_mib"] = peak.stop()
    time.sleep(5.0)  # the old version's requests are done: a helper of its own has exited
    run["after the reload"] = sample()
    shown = {k: v for k, v in run.items() if k != "samples"}
    print(f"[{folder.name}] reload {shown}; load {load_avg()}", flush=True)
    return run


# --- report ---------------------------------------------------------------------------------------


def pooled_reloads(paths: list[Path], size: str) -> str:
    """Each phase's p99 over every run's requests (a run's p99 over a few hundred is its third
    slowest, which one stall decides), with and without the requests a host stall overlapped, and
    its ratio to the steady phase's."""
    runs = []
    for path in paths:
        row = json.loads(path.read_text())["rows"][size]
        runs += [row["reload"], *row.get("reload_repeats", [])]
    lines = [f"{len(runs)} reloads pooled; phase: p99 ms (x steady), p99 ms without host stalls (x steady)"]
    every = {p: [ms for run in runs for ms, _ in run["samples"][p]] for p in PHASES}
    calm = {p: [ms for run in runs for ms, hit in run["samples"][p] if not hit] for p in PHASES}
    for phase in PHASES:
        a, b = percentile(every[phase], 99), percentile(calm[phase], 99)
        base_a, base_b = percentile(every["steady"], 99), percentile(calm["steady"], 99)
        lines.append(f"{phase}: {a:.1f} ({a / base_a:.2f}x), {b:.1f} ({b / base_b:.2f}x); {len(every[phase])} requests")
    builds = [run["add_build"] for run in runs]
    lines.append("builds: " + ", ".join(f"{b['seconds']:.0f} s ({b.get('peak_rss_mib', 0):.0f} MiB)" for b in builds))
    return "\n".join(lines)


def table(rows: dict[int, dict[str, Any]]) -> str:
    lines = [
        "| chunks | build s | build peak RSS MiB | disk MiB | recall@10 | to SERVING s | RSS at SERVING MiB "
        "| anon MiB at SERVING | dense p50/p99 ms | lexical p50/p99 | hybrid p50/p99 | hybrid + tiers p50/p99 "
        "| +1% build s | reload s | p99 steady / beside the build / during reload ms | peak RSS in reload MiB |",
        "|" + "---|" * 16,
    ]
    for size, r in rows.items():
        lay, rel = r["layouts"], r["reload"]
        cells = [
            f"{size:,}",
            f"{r['build']['seconds']:.0f}",
            f"{r['build']['peak_rss_mib']:.0f}",
            f"{r['disk_mib']:.0f}",
            " ".join(f"{k}: {v:.3f}" for k, v in r["recall@10"].items()),
            f"{lay['hybrid']['to_serving_s']:.1f}" if "hybrid" in lay else "",
            f"{lay['hybrid']['rss_serving_mib']:.0f}" if "hybrid" in lay else "",
            f"{lay['hybrid']['anon_serving_mib']:.0f}" if "hybrid" in lay else "",
        ]
        cells += [f"{lay[n]['p50_ms']:.1f} / {lay[n]['p99_ms']:.1f}" if n in lay else "" for n, _ in LAYOUTS]
        cells += [
            "copy" if rel["add_build"].get("copied") else f"{rel['add_build']['seconds']:.0f}",
            f"{rel['reload_s']:.1f}",
            f"{rel['steady p99 ms']:.1f} / {rel['beside the build p99 ms']:.1f} / {rel['reload p99 ms']:.1f}",
            f"{rel['peak_rss_mib']:.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("build-one")
    for name in ("corpus", "index", "vectors"):
        one.add_argument(name, type=Path)
    for name in ("run",):
        p = sub.add_parser(name)
        p.add_argument("--base-index", type=Path, required=True, help="a SciFact index root or version folder")
        p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
        p.add_argument("--work", type=Path, required=True)
        p.add_argument("--sizes", default="10000,100000,1000000")
        p.add_argument("--efs", default="64,128,256")
        p.add_argument("--queries", type=int, default=300)
        p.add_argument("--build-only", action="store_true", help="make and build the corpora, measure nothing else")
        p.add_argument("--layouts", type=lambda v: v.split(","), help="only these layouts (comma-separated names)")
        p.add_argument("--reload-repeats", type=int, default=1, help="reloads to a copy, on one server")
        p.add_argument(
            "--copy-reload-from",
            type=int,
            default=0,
            help="from this size up, reload to a copy of the version instead of building 1%% more beside the server",
        )
    pool = sub.add_parser("pool", help="pool the reloads of several runs' results.json (one size)")
    pool.add_argument("results", type=Path, nargs="+")
    pool.add_argument("--size", default="1000000")
    args = parser.parse_args()
    if args.command == "build-one":
        build_one(args.corpus, args.index, args.vectors)
        return
    if args.command == "pool":
        print(pooled_reloads(args.results, args.size))
        return
    args.base_index = (
        (args.base_index / "CURRENT").resolve() if (args.base_index / "CURRENT").exists() else args.base_index
    )
    args.work.mkdir(parents=True, exist_ok=True)
    header = f"{cpu_name()}, {os.cpu_count()} CPUs, commit {git_head()}, load at start {load_avg()}"
    args.efs = [int(x) for x in args.efs.split(",")]
    queries = list(load_queries(args.data).values())[: args.queries]
    qvecs = query_vectors(args.data, args.queries)
    rows = {}
    for size in (int(x) for x in args.sizes.split(",")):
        rows[size] = measure_size(args, size, queries, qvecs)
        (args.work / "results.json").write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    text = header + "\n\n" + ("builds only" if args.build_only else table(rows))
    (args.work / f"{args.command}.md").write_text(text + f"\n\nload at end {load_avg()}\n")
    print(text)


if __name__ == "__main__":
    main()
