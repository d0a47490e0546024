"""Generation on vLLM servers against the in-process engine, and routing across two servers.

    python benchmarks/bench_remote.py --out bench-results/remote
    python benchmarks/bench_remote.py --out /tmp/remote-smoke --paragraphs 3
    python benchmarks/bench_remote.py --out bench-results/remote-pair --single   # local and remote-1 only

Indexes `<data>/corpus.jsonl` (SQuAD v2 dev; not shipped) and asks the recurring workload of
benchmarks/bench_reuse.py (every question of `--paragraphs` paragraphs, shuffled) through `Query`,
one request at a time, temperature 0, answer cache off, one configuration after another:

  local              the in-process engine (the default; both CPUs)
  remote-1           one vLLM server (`python -m vllm.entrypoints.openai.api_server`, both CPUs)
  2x document        two servers (one CPU each), the sidecar routing by document (rendezvous)
  2x round_robin     the same two servers, round robin
  router cache_aware the same two servers behind vLLM's router, its prefix-aware policy
  router consistent_hash   ... its consistent_hash policy on the sidecar's routing header
  2x document, one killed  the first server killed a third of the way through

The servers' prefix caches are reset between configurations (vLLM's dev-mode /reset_prefix_cache).
Reported: client TTFT p50/p95, time to the whole answer, prompt and cached tokens per request,
errors (for the kill run: the requests that failed when a server died). Writes results.md,
results.json and ttft.png (TTFT distributions) to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import (  # noqa: E402
    ensure_index,
    load_avg,
    percentile,
    plot_ttft,
    start_server,
    stop_server,
    write_results,
)
from benchmarks.workloads import (  # noqa: E402
    WARMUP,
    HttpProcess,
    Question,
    ask,
    load_questions,
    recurring,
    reset_prefix_cache,
    spawn_router,
    spawn_vllm_server,
    wait_http_ok,
    wait_warm,
)
from ragserve.client import RagClient  # noqa: E402
from ragserve.config import GeneratorSettings  # noqa: E402
from ragserve.generate.host import read_host_cpu, resolve_engine  # noqa: E402


async def drive(
    target: str,
    questions: list[Question],
    max_tokens: int,
    victim: tuple[int, HttpProcess] | None = None,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    async with RagClient(target, default_timeout_s=120) as client:
        await ask(client, WARMUP, max_tokens)
        await wait_warm(client)  # pre-filling the most retrieved passages runs after SERVING
        for i, q in enumerate(questions):
            if victim is not None and i == victim[0]:
                victim[1].kill()  # the whole server: API, engine core and workers
            try:
                row = await ask(client, q, max_tokens)
            except Exception as exc:
                row = {
                    "id": q.id,
                    "ok": False,
                    "error": type(exc).__name__ + ": " + str(getattr(exc, "code", lambda: "")()),
                }
            row["index"] = i
            rows.append(row)
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if r["ok"] and "ttft_ms" in r]
    return {
        "n": len(rows),
        "errors": len(rows) - len(ok),
        "ttft_p50": percentile([r["ttft_ms"] for r in ok], 50),
        "ttft_p95": percentile([r["ttft_ms"] for r in ok], 95),
        "total_p50": percentile([r["total_ms"] for r in ok], 50),
        "prompt_mean": sum(r["prompt_tokens"] for r in ok) / max(1, len(ok)),
        "cached_mean": sum(r["cached_tokens"] for r in ok) / max(1, len(ok)),
    }


def routed_pair(model: Path, dtype: str, run: Any, remote: Any, out: Path, count: int) -> None:
    """Two servers (one CPU each): routed by the sidecar two ways, behind the router two ways, and
    one killed a third of the way through."""
    pair = [spawn_vllm_server(model, out / f"vllm-{i}.log", str(i), dtype) for i in range(2)]
    urls = [s.url for s in pair]
    routers: list[HttpProcess] = []
    try:
        for s in pair:
            wait_http_ok(s)
        for routing in ("document", "round_robin"):
            run(f"2x {routing}", remote(urls, RAGSERVE_GENERATOR_REMOTE_ROUTING=routing))
            for s in pair:
                reset_prefix_cache(s)
        for policy in ("cache_aware", "consistent_hash"):
            router = spawn_router(urls, policy, out / f"router-{policy}.log")
            routers.append(router)
            wait_http_ok(router)
            run(f"router {policy}", remote([router.url]))
            router.stop()
            for s in pair:
                reset_prefix_cache(s)
        run("2x document, one killed", remote(urls), victim=(count // 3, pair[0]))
    finally:
        for router in routers:
            router.stop()
        for s in pair:
            s.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "squad2-dev")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "remote")
    parser.add_argument("--index", type=Path)
    parser.add_argument("--paragraphs", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--single", action="store_true", help="only the local engine and one server (before/after)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.index = ensure_index(args.index, args.out, args.data / "corpus.jsonl")
    questions = recurring(load_questions(args.data, args.seed), args.paragraphs, args.seed)
    dtype = resolve_engine(GeneratorSettings(), read_host_cpu()).dtype  # what the local engine picks here
    base = {"RAGSERVE_CACHE_ANSWERS": "false"}
    results: dict[str, dict[str, Any]] = {}
    load_before = load_avg()

    def run(name: str, env: dict[str, str], victim: tuple[int, HttpProcess] | None = None) -> None:
        process, target = start_server(args.index, {**base, **env}, args.out / f"sidecar-{name.replace(' ', '-')}.log")
        try:
            rows = asyncio.run(drive(target, questions, args.max_tokens, victim))
        finally:
            stop_server(process)
        results[name] = {"rows": rows, "summary": summarize(rows)}
        s = results[name]["summary"]
        print(f"[{name}] TTFT p50 {s['ttft_p50']:.0f} ms, cached {s['cached_mean']:.0f}/{s['prompt_mean']:.0f}, "
              f"errors {s['errors']}; load {load_avg()}", flush=True)  # fmt: skip

    def remote(urls: list[str], **extra: str) -> dict[str, str]:
        return {"RAGSERVE_GENERATOR_BACKEND": "remote", "RAGSERVE_GENERATOR_REMOTE_URLS": ",".join(urls), **extra}

    run("local", {})
    model = Path(GeneratorSettings().resolved_model())  # the folder the sidecar serves
    server = spawn_vllm_server(model, args.out / "vllm-both.log", "0-1", dtype)
    try:
        wait_http_ok(server)
        run("remote-1", remote([server.url]))
    finally:
        server.stop()

    if not args.single:
        routed_pair(model, dtype, run, remote, args.out, len(questions))

    lines = [
        "# Generation on vLLM servers (SQuAD v2 dev, recurring documents, through Query)",
        "",
        f"Host: {read_host_cpu().describe()}; dtype {dtype}. Load before: {load_before}. {len(questions)} questions "
        f"of {args.paragraphs} paragraphs, max_tokens {args.max_tokens}, one at a time, answer cache off.",
        "",
        "| configuration | n | errors | TTFT p50 / p95 ms | answer p50 ms | prompt tokens / request "
        "| cached / request |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        s = r["summary"]
        lines.append(
            f"| {name} | {s['n']} | {s['errors']} | {s['ttft_p50']:.0f} / {s['ttft_p95']:.0f} | {s['total_p50']:.0f} "
            f"| {s['prompt_mean']:.0f} | {s['cached_mean']:.0f} |"
        )
    write_results(args.out, "\n".join(lines) + "\n", results)
    plot_ttft(
        {
            name: [row["ttft_ms"] for row in r["rows"] if row.get("ok") and "ttft_ms" in row]
            for name, r in results.items()
        },
        args.out,
    )


if __name__ == "__main__":
    main()
