"""Sizing one sidecar: memory by layout, per indexed chunk and per KV-cache GiB, start-up time,
indexing speed and disk per index version.

    python benchmarks/bench_sizing.py --out bench-results/sizing

Builds two indexes with this tree's indexer (the SQuAD 2.0 dev sample, and the first `--docs`
SciFact documents: a bigger corpus), timing the second (documents/s) and measuring each version's
folder on disk. Then starts fresh servers one after the other, each on a free port:

  retrieval-only   RAGSERVE_GENERATION_ENABLED=false, on each index (the difference per chunk)
  local engine     the default layout, with RAGSERVE_GENERATOR_CPU_KVCACHE_SPACE_GIB 1 and 2
                   (the difference per KV-cache GiB)

For each: seconds to SERVING, RSS (the server and its child processes) at SERVING, and RSS after
load with the caches filling: `--retrieves` distinct Retrieves (retrieval cache) and, with a
generator, warming settled and `--queries` Queries (answer cache). Writes results.md and
results.json to `--out`. The model files come prepared (set-up); a first start that prepares or
exports them is not measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import git_head, load_avg, start_server, stop_server, write_results  # noqa: E402
from benchmarks.workloads import load_questions, wait_warm  # noqa: E402
from ragserve.client import RagClient  # noqa: E402
from ragserve.generate.host import read_host_cpu  # noqa: E402


def status_mib(pid: int, field: str = "VmRSS") -> float:
    """`field` of /proc/PID/status (VmRSS, RssAnon, VmHWM, ...) of one process, in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(x for x in status.splitlines() if x.startswith(field + ":")).split()[1]) / 1024


def graph_helpers(pid: int) -> list[int]:
    """The graph helper processes below `pid` (one per graph held)."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "ragserve.index.graph_process" in " ".join(child.cmdline()):
                found.append(child.pid)
        except psutil.Error:
            continue  # ended meanwhile
    return found


def memory_and_helpers(pid: int) -> dict[str, Any]:
    return {"rss_mib": tree_rss_mib(pid), "graph_helpers": graph_helpers(pid)}


def tree_rss_mib(pid: int, field: str = "VmRSS") -> float:
    """`field` of /proc/PID/status summed over `pid` and every process below it (the engine-core
    process, a big version's graph helper)."""
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            total += status_mib(current, field)
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, StopIteration):
            continue  # a process that ended between two reads
    return total


def build(corpus: Path, index: Path) -> float:
    """Seconds to index `corpus` into `index` (a fresh folder)."""
    started = time.perf_counter()
    command = [sys.executable, "-m", "indexer", "build", str(corpus), "--out", str(index), "--no-progress"]
    subprocess.run(command, check=True, cwd=REPO, capture_output=True)
    return time.perf_counter() - started


def version_disk_mib(index: Path) -> float:
    folder = (index / "CURRENT").resolve()
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / (1 << 20)


def chunks_of(index: Path) -> int:
    manifest = json.loads(((index / "CURRENT").resolve() / "manifest.json").read_text())
    return int(manifest["count"])


async def load(target: str, questions: list[str], retrieves: int, queries: int, generator: bool) -> None:
    async with RagClient(target, default_timeout_s=120) as client:
        for q in questions[:retrieves]:
            await client.retrieve(q)
        if generator:
            await wait_warm(client)
            for q in questions[retrieves : retrieves + queries]:
                async for _ in client.query(q, max_tokens=16, temperature=0.0):
                    pass


def run(args: argparse.Namespace, name: str, index: Path, env: dict[str, str], generator: bool) -> dict[str, Any]:
    started = time.perf_counter()
    process, target = start_server(index, env, args.out / f"server-{name}.log")
    try:
        serving_s = time.perf_counter() - started
        at_start = tree_rss_mib(process.pid)
        asyncio.run(load(target, args.questions, args.retrieves, args.queries, generator))
        loaded = tree_rss_mib(process.pid)
    finally:
        stop_server(process)
    row = {"serving_s": serving_s, "rss_start_mib": at_start, "rss_loaded_mib": loaded, "chunks": chunks_of(index)}
    print(f"[{name}] SERVING {serving_s:.1f} s, RSS {at_start:.0f} -> {loaded:.0f} MiB; load {load_avg()}", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shared = REPO.parent / "shared" / "data"
    parser.add_argument("--squad", type=Path, default=shared / "squad2-dev")
    parser.add_argument("--scifact", type=Path, default=shared / "scifact")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "sizing")
    parser.add_argument("--docs", type=int, default=1500, help="SciFact documents in the bigger index")
    parser.add_argument("--retrieves", type=int, default=200)
    parser.add_argument("--queries", type=int, default=40)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.questions = list(dict.fromkeys(q.question for q in load_questions(args.squad, seed=5)))
    small, big = args.out / "index-squad", args.out / "index-scifact"
    subset = args.out / "scifact-subset" / "corpus.jsonl"
    subset.parent.mkdir(exist_ok=True)
    with (args.scifact / "corpus.jsonl").open() as source:
        subset.write_text("".join(line for _, line in zip(range(args.docs), source, strict=False)))
    for index in (small, big):
        subprocess.run(["rm", "-rf", str(index)], check=True)
    build(args.squad / "corpus.jsonl", small)
    big_s = build(subset, big)
    retrieval = {"RAGSERVE_GENERATION_ENABLED": "false"}
    rows = {
        "retrieval-only, SQuAD sample": run(args, "retrieval-small", small, retrieval, False),
        "retrieval-only, SciFact subset": run(args, "retrieval-big", big, retrieval, False),
        "local engine, KV 1 GiB": run(
            args, "local-kv1", small, {"RAGSERVE_GENERATOR_CPU_KVCACHE_SPACE_GIB": "1"}, True
        ),
        "local engine, KV 2 GiB": run(
            args, "local-kv2", small, {"RAGSERVE_GENERATOR_CPU_KVCACHE_SPACE_GIB": "2"}, True
        ),
    }
    small_row, big_row = rows["retrieval-only, SQuAD sample"], rows["retrieval-only, SciFact subset"]
    per_chunk_kib = (
        (big_row["rss_loaded_mib"] - small_row["rss_loaded_mib"]) * 1024 / (big_row["chunks"] - small_row["chunks"])
    )
    per_kv_gib = rows["local engine, KV 2 GiB"]["rss_loaded_mib"] - rows["local engine, KV 1 GiB"]["rss_loaded_mib"]
    disk = {"SQuAD sample": version_disk_mib(small), "SciFact subset": version_disk_mib(big)}
    lines = [
        "# Sizing one sidecar",
        "",
        f"Host: {read_host_cpu().describe()}. Commit {git_head()}. A fresh server per row, one after the other; "
        f"load: {args.retrieves} Retrieves, then (with a generator) warming settled and {args.queries} Queries "
        "(max_tokens 16).",
        "",
        "| row | chunks | to SERVING s | RSS at SERVING MiB | RSS after load MiB |",
        "|---|---|---|---|---|",
        *(
            f"| {name} | {r['chunks']} | {r['serving_s']:.1f} | {r['rss_start_mib']:.0f} | {r['rss_loaded_mib']:.0f} |"
            for name, r in rows.items()
        ),
        "",
        f"- per indexed chunk (retrieval-only, after load): {per_chunk_kib:.1f} KiB",
        f"- per KV-cache GiB (local engine, after load): {per_kv_gib:.0f} MiB",
        f"- indexing: {args.docs} SciFact documents ({big_row['chunks']} chunks) in {big_s:.1f} s, "
        f"{args.docs / big_s:.1f} documents/s",
        f"- disk per index version: SQuAD sample {disk['SQuAD sample']:.1f} MiB ({small_row['chunks']} chunks), "
        f"SciFact subset {disk['SciFact subset']:.1f} MiB ({big_row['chunks']} chunks)",
    ]
    write_results(
        args.out,
        "\n".join(lines) + "\n",
        {
            "rows": rows,
            "per_chunk_kib": per_chunk_kib,
            "per_kv_gib_mib": per_kv_gib,
            "disk_mib": disk,
            "index_s": big_s,
        },
    )


if __name__ == "__main__":
    main()
