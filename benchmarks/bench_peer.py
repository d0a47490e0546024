"""ragserve against a peer built the usual way, right after both start: Haystack (BM25, a chat
prompt with five passages, OpenAIChatGenerator streaming) on a vLLM OpenAI-compatible server with
the same model and dtype, on the same host, the same questions, client TTFT.

    python -m venv /tmp/haystack && /tmp/haystack/bin/pip install haystack-ai
    python benchmarks/bench_peer.py --out bench-results/peer --haystack-python /tmp/haystack/bin/python
    RAGSERVE_BENCH_SLOW=compile python benchmarks/bench_peer.py ...   # a C++ build at nice 19 beside

Indexes `<data>/corpus.jsonl` (default ../shared/data/squad2-dev), starts the vLLM server (the
embedded default's model folder, this host's dtype as ragserve picks it, both CPUs) and a real
`ragserve serve` with its defaults (whole-corpus warming on, as a new user gets it), then asks
`--questions` SQuAD v2 dev questions, one at a time, alternating which asks first, as soon as both
are up: the first minutes after start, warming included. max_tokens 32, temperature 0.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import (  # noqa: E402
    cpu_name,
    ensure_index,
    git_head,
    load_avg,
    percentile,
    start_server,
    stop_server,
    write_results,
)
from benchmarks.workloads import load_questions, spawn_vllm_server, wait_http_ok  # noqa: E402
from ragserve.client import RagClient  # noqa: E402

DEFAULT_DATA = REPO.parent / "shared" / "data" / "squad2-dev"


def ours_dtype() -> str:
    from ragserve.config import GeneratorSettings
    from ragserve.generate.host import read_host_cpu, resolve_engine

    return resolve_engine(GeneratorSettings(), read_host_cpu()).dtype


async def ask_ours(client: RagClient, question: str, max_tokens: int) -> dict[str, float]:
    started, row = time.perf_counter(), {}
    async for event in client.query(question, max_tokens=max_tokens, temperature=0.0, timeout_s=120):
        kind = event.WhichOneof("event")
        if kind == "token" and "ttft_ms" not in row:
            row["ttft_ms"] = (time.perf_counter() - started) * 1000.0
        elif kind == "final":
            row["prompt_tokens"] = event.final.usage.prompt_tokens
    row["total_ms"] = (time.perf_counter() - started) * 1000.0
    return row


def ask_peer(peer: subprocess.Popen[str], question: str) -> dict[str, Any]:
    assert peer.stdin is not None and peer.stdout is not None
    peer.stdin.write(question.replace("\n", " ") + "\n")
    peer.stdin.flush()
    return dict(json.loads(peer.stdout.readline()))


async def run(target: str, peer: subprocess.Popen[str], questions: list[str], max_tokens: int) -> dict[str, list[Any]]:
    rows: dict[str, list[Any]] = {"ragserve": [], "peer": []}
    async with RagClient(target) as client:
        for n, question in enumerate(questions):
            order = ["ragserve", "peer"] if n % 2 == 0 else ["peer", "ragserve"]
            for side in order:
                if side == "ragserve":
                    rows[side].append(await ask_ours(client, question, max_tokens))
                else:
                    rows[side].append(await asyncio.to_thread(ask_peer, peer, question))
    return rows


def table(rows: dict[str, list[Any]]) -> str:
    def stat(side: str, key: str, q: float) -> float:
        return percentile([r[key] for r in rows[side] if key in r], q)

    lines = ["| | TTFT p50 | TTFT p95 | whole p50 | prompt tokens p50 |", "|---|---|---|---|---|"]
    for side in rows:
        lines.append(
            f"| {side} | {stat(side, 'ttft_ms', 50):.0f} ms | {stat(side, 'ttft_ms', 95):.0f} ms | "
            f"{stat(side, 'total_ms', 50):.0f} ms | {stat(side, 'prompt_tokens', 50):.0f} |"
        )
    ratio50 = stat("peer", "ttft_ms", 50) / stat("ragserve", "ttft_ms", 50)
    ratio95 = stat("peer", "ttft_ms", 95) / stat("ragserve", "ttft_ms", 95)
    lines.append(f"\npeer / ragserve TTFT: **{ratio50:.2f}x** at p50, **{ratio95:.2f}x** at p95")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--index", type=Path, default=None)
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--haystack-python", required=True, help="a Python with haystack-ai installed")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    index = ensure_index(args.index, args.out, args.data / "corpus.jsonl")
    questions = [q.question for q in load_questions(args.data, seed=11)[: args.questions]]
    from ragserve.config import GeneratorSettings

    model, dtype = GeneratorSettings().resolved_model(), ours_dtype()
    vllm = spawn_vllm_server(Path(model), args.out / "vllm.log", "0-1", dtype)
    worker = [args.haystack_python, str(REPO / "benchmarks" / "peer_worker.py")]
    command = [*worker, str(args.data / "corpus.jsonl"), vllm.url, model, str(args.max_tokens)]
    peer = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        process, target = start_server(index, {"RAGSERVE_WARM_WHOLE_CORPUS": "true"}, args.out / "server.log")
        try:
            wait_http_ok(vllm, "/health")
            assert peer.stdout is not None and json.loads(peer.stdout.readline()).get("ready")
            rows = asyncio.run(run(target, peer, questions, args.max_tokens))
        finally:
            stop_server(process)
    finally:
        peer.kill()
        vllm.stop()
    text = "\n".join(
        [
            f"# ragserve against Haystack on vLLM, right after start ({cpu_name()}, {dtype}, load {load_avg()}, "
            f"{git_head()})",
            f"{len(questions)} SQuAD v2 dev questions, alternating, max_tokens {args.max_tokens}",
            "",
            table(rows),
        ]
    )
    write_results(args.out, text, rows)


if __name__ == "__main__":
    main()
