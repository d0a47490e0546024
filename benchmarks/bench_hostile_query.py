"""A hostile question against a big index: one common word repeated through the whole question and a
whole history turn, through Query, with the server's memory watched while it runs.

    python benchmarks/bench_hostile_query.py --index /tmp/scale/n1000000/index --out bench-results/hostile

Lexical search scores every posting of every query term. A question of RAGSERVE_MAX_QUERY_CHARS
(2,000) characters that repeats one word, with a history turn of RAGSERVE_CONVERSATION_MAX_TURN_CHARS
(4,000) that repeats it too, asks for that word's postings once per repeat unless each distinct term
is scored once (index/bm25.py). Phases on one server (generation on, one token per answer, so the
figure is retrieval's; whole-corpus warming off; no cache):

  ordinary        SciFact claims, each with the next claim as its history turn
  long ordinary   the same lengths as the hostile ones (2,000 and 4,000 characters), of SciFact
                  claims run together: what a long question costs with ordinary words
  hostile         one word repeated through the question and the turn, `--repeats` times per word

Reported per phase: the server's `retrieval_total_ms` p50/p99/max (and the slowest request's
stages), and its memory, sampled every 2 ms from /proc while the phase runs: the growth of the
peak over the median before the phase, of RssAnon (what the process allocated: the mapped
docstore's and vectors' file pages are left out, they are the page cache) and of VmRSS, and VmHWM
(the high-water mark of VmRSS) before and after. Writes results.md and results.json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_sizing import status_mib  # noqa: E402
from benchmarks.harness import cpu_name, git_head, load_avg, percentile, start_server, stop_server, write_results  # noqa: E402
from benchmarks.workloads import load_queries  # noqa: E402
from ragserve.client import RagClient  # noqa: E402

SERVER_ENV = {"RAGSERVE_WARM_WHOLE_CORPUS": "false", "RAGSERVE_CACHE_BACKEND": "off"}
QUESTION_CHARS = 2000
TURN_CHARS = 4000


class RssWatch:
    """The process's RssAnon and VmRSS every 2 ms in a thread, until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.anon: list[float] = []
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.anon.append(status_mib(self.pid, "RssAnon"))
            self.samples.append(status_mib(self.pid, "VmRSS"))
            time.sleep(0.002)

    def __enter__(self) -> RssWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_together(claims: Iterator[str], chars: int) -> str:
    text = ""
    while len(text) < chars:
        text += next(claims) + " "
    return text[:chars].strip()


def repeated(word: str, chars: int) -> str:
    return ((word + " ") * (chars // (len(word) + 1)))[:chars].strip()


STAGES = ("embed_ms", "search_ms", "rerank_ms", "evidence_ms", "retrieval_total_ms")


async def ask(target: str, asks: list[tuple[str, str]]) -> list[dict[str, float]]:
    """Each (question, turn) through Query, one token, one at a time: the server's stage times."""
    times = []
    async with RagClient(target) as client:
        for question, turn in asks:
            async for event in client.query(question, max_tokens=1, timeout_s=60, history=[("user", turn)]):
                if event.WhichOneof("event") == "final":
                    times.append({name: getattr(event.final.timings, name) for name in STAGES})
    return times


def phase(target: str, pid: int, asks: list[tuple[str, str]]) -> dict[str, Any]:
    with RssWatch(pid) as before:
        time.sleep(1.0)
    hwm_before = status_mib(pid, "VmHWM")
    try:
        with RssWatch(pid) as during:
            stages = asyncio.run(ask(target, asks))
    except Exception as exc:  # the server gone (its memory cap), or a refusal: the phase's row says so
        peak = max(during.anon, default=0.0)
        return {"requests": f"failed ({type(exc).__name__}) at an anon peak of {peak:.0f} MiB"}
    baseline, anon = statistics.median(before.samples), statistics.median(before.anon)
    times = [row["retrieval_total_ms"] for row in stages]
    slowest = max(stages, key=lambda row: row["retrieval_total_ms"])
    return {
        "requests": len(times),
        "retrieval p50 ms": percentile(times, 50),
        "retrieval p99 ms": percentile(times, 99),
        "retrieval max ms": max(times),
        "anon before MiB": anon,
        "anon peak growth MiB": max(during.anon) - anon,
        "rss peak growth MiB": max(during.samples) - baseline,
        "VmHWM before MiB": hwm_before,
        "VmHWM after MiB": status_mib(pid, "VmHWM"),
        "slowest: embed / search / rerank / evidence ms": " / ".join(f"{slowest[name]:.1f}" for name in STAGES[:-1]),
        "search p50 ms": percentile([row["search_ms"] for row in stages], 50),
    }


def memory_capped(gib: float) -> tuple[str, ...]:
    """A command prefix that runs the server in a memory cgroup of `gib` (v1 or v2): a tree whose
    lexical search allocates per repeat (before index/bm25.py's fix) is stopped there, not the host."""
    v1 = Path("/sys/fs/cgroup/memory")
    group = (v1 if v1.is_dir() else Path("/sys/fs/cgroup")) / "ragserve-bench-memory"
    group.mkdir(exist_ok=True)
    limit = "memory.limit_in_bytes" if v1.is_dir() else "memory.max"
    (group / limit).write_text(str(int(gib * 2**30)))
    return ("sh", "-c", f'echo $$ > {group / "cgroup.procs"} && exec "$@"', "sh")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    parser.add_argument("--words", default="cells,patients,the", help="the repeated words, comma-separated")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--ordinary", type=int, default=50)
    parser.add_argument("--tree", type=Path, default=REPO, help="the source tree whose server runs (a worktree)")
    parser.add_argument(
        "--memory-cap-gib", type=float, default=0, help="the server in a memory cgroup of this size (root; 0: none)"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    claims = list(load_queries(args.data).values())
    ordinary = [(claims[i], claims[i + 1]) for i in range(0, 2 * args.ordinary, 2)]
    later = iter(claims[2 * args.ordinary :])
    long_ordinary = [
        (run_together(later, QUESTION_CHARS), run_together(later, TURN_CHARS)) for _ in range(args.repeats)
    ]
    header = f"{cpu_name()}, commit {git_head(args.tree)}, index {args.index}, load at start {load_avg()}"
    prefix = memory_capped(args.memory_cap_gib) if args.memory_cap_gib else ()
    process, target = start_server(args.index, SERVER_ENV, args.out / "server.log", repo=args.tree, prefix=prefix)
    results: dict[str, Any] = {}
    try:
        asyncio.run(ask(target, ordinary[:5]))  # the first calls' one-off costs
        results["ordinary"] = phase(target, process.pid, ordinary)
        results["long ordinary"] = phase(target, process.pid, long_ordinary)
        for word in args.words.split(","):
            hostile = [(repeated(word, QUESTION_CHARS), repeated(word, TURN_CHARS))] * args.repeats
            results[f"hostile: {word!r}"] = phase(target, process.pid, hostile)
    finally:
        stop_server(process)
    columns = list(next(iter(results.values())))
    lines = [header, "", "| phase | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name, row in results.items():
        cells = [f"{v:.1f}" if isinstance(v, float) else str(v) for v in row.values()]
        lines.append(f"| {name} | " + " | ".join(cells + [""] * (len(columns) - len(cells))) + " |")
    lines.append(f"\nload at end {load_avg()}")
    write_results(args.out, "\n".join(lines), {"header": header, "results": results})
    print("\n".join(lines))


if __name__ == "__main__":
    main()
