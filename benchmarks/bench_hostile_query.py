"""A hostile question against a big index: one common word repeated through the whole question and a
whole history turn, through Query, with the server's memory watched while it runs.

    python benchmarks/bench_hostile_query.py --index /tmp/scale/n1000000/index --out bench-results/hostile

Lexical search scores every posting of every query term. A question of RAGSERVE_MAX_QUERY_CHARS
(2,000) characters that repeats one word, with a history turn of RAGSERVE_CONVERSATION_MAX_TURN_CHARS
(4,000) that repeats it too, asks for that word's postings once per repeat unless each distinct term
is scored once (index/bm25.py). Phases on one server (generation on, one token per answer, so the
figure is retrieval's; whole-corpus warming off):

  ordinary   SciFact claims, each with a short history turn (the same path, ordinary text)
  hostile    the word repeated through the question and the turn, `--repeats` times per word

Reported per phase: the server's `retrieval_total_ms` p50/p99/max, and its resident memory, sampled
every 2 ms from /proc while the phase runs: the growth of the peak over the median before the phase,
and VmHWM (the process's high-water mark) before and after. Writes results.md and results.json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import cpu_name, git_head, load_avg, percentile, start_server, stop_server, write_results  # noqa: E402
from benchmarks.workloads import load_queries  # noqa: E402
from ragserve.client import RagClient  # noqa: E402

SERVER_ENV = {"RAGSERVE_WARM_WHOLE_CORPUS": "false", "RAGSERVE_CACHE_BACKEND": "off"}
QUESTION_CHARS = 2000
TURN_CHARS = 4000


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


class RssWatch:
    """The process's VmRSS every 2 ms in a thread, until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(status_kib(self.pid, "VmRSS"))
            time.sleep(0.002)

    def __enter__(self) -> RssWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def repeated(word: str, chars: int) -> str:
    return ((word + " ") * (chars // (len(word) + 1)))[:chars].strip()


async def ask(target: str, asks: list[tuple[str, str]]) -> list[float]:
    """Each (question, turn) through Query, one token, one at a time: the server's retrieval ms."""
    times = []
    async with RagClient(target) as client:
        for question, turn in asks:
            async for event in client.query(question, max_tokens=1, timeout_s=60, history=[("user", turn)]):
                if event.WhichOneof("event") == "final":
                    times.append(event.final.timings.retrieval_total_ms)
    return times


def phase(target: str, pid: int, asks: list[tuple[str, str]]) -> dict[str, Any]:
    with RssWatch(pid) as before:
        time.sleep(1.0)
    hwm_before = status_kib(pid, "VmHWM")
    with RssWatch(pid) as during:
        times = asyncio.run(ask(target, asks))
    baseline = statistics.median(before.samples)
    return {
        "requests": len(times),
        "retrieval p50 ms": percentile(times, 50),
        "retrieval p99 ms": percentile(times, 99),
        "retrieval max ms": max(times),
        "rss before MiB": baseline / 1024,
        "rss peak growth MiB": (max(during.samples) - baseline) / 1024,
        "samples": len(during.samples),
        "VmHWM before MiB": hwm_before / 1024,
        "VmHWM after MiB": status_kib(pid, "VmHWM") / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    parser.add_argument("--words", default="cells,patients,the", help="the repeated words, comma-separated")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--ordinary", type=int, default=50)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    claims = list(load_queries(args.data).values())
    ordinary = [(claims[i], claims[i + 1]) for i in range(0, 2 * args.ordinary, 2)]
    header = f"{cpu_name()}, commit {git_head()}, index {args.index}, load at start {load_avg()}"
    process, target = start_server(args.index, SERVER_ENV, args.out / "server.log")
    results: dict[str, Any] = {}
    try:
        asyncio.run(ask(target, ordinary[:5]))  # the first calls' one-off costs
        results["ordinary"] = phase(target, process.pid, ordinary)
        for word in args.words.split(","):
            hostile = [(repeated(word, QUESTION_CHARS), repeated(word, TURN_CHARS))] * args.repeats
            results[f"hostile: {word!r}"] = phase(target, process.pid, hostile)
    finally:
        stop_server(process)
    columns = list(next(iter(results.values())))
    lines = [header, "", "| phase | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name, row in results.items():
        lines.append(
            f"| {name} | " + " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in row.values()) + " |"
        )
    lines.append(f"\nload at end {load_avg()}")
    write_results(args.out, "\n".join(lines), {"header": header, "results": results})
    print("\n".join(lines))


if __name__ == "__main__":
    main()
