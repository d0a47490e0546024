"""Load benchmark over gRPC: ragserve against a naive pipeline, in one run.

    python benchmarks/bench_load.py --out bench-results/load            # ~10 minutes on 2 cores
    python benchmarks/bench_load.py --out bench-results/load --quick    # ~4 minutes

For each configuration a real server process is started on loopback (real MiniLM, hnswlib, vLLM)
on the bundled sample corpus, then driven with
  * closed loop: C clients, each sending its next Query when the previous one finished;
  * open loop: Poisson arrivals at a fixed rate, whatever the server's state.
Reported per run: p50/p95/p99 of server-side retrieval time, client-side TTFT, time per output
token, throughput and errors; PNG plots; and naive/ragserve ratios.

Both servers run side by side; each load level runs on one, then on the other.
The naive configuration is the same server with no retrieval budget (60 s), no retrieval cache,
and a prompt whose first tokens are the question (so vLLM's prefix cache cannot reuse the template).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import percentile, start_server, stop_server  # noqa: E402
from ragserve.client import RagClient  # noqa: E402

CONFIGS = {
    "ragserve": {},
    "naive": {
        "RAGSERVE_PROMPT_LAYOUT": "naive",
        "RAGSERVE_CACHE_BACKEND": "off",
        "RAGSERVE_RETRIEVAL_BUDGET_MS": "60000",
    },
}


@dataclass
class Sample:
    ok: bool
    code: str = "OK"
    retrieval_ms: float = 0.0
    ttft_ms: float = 0.0  # client side: request sent -> first token event
    tpot_ms: float = 0.0
    total_ms: float = 0.0
    completion_tokens: int = 0
    prefix_hit_tokens: int = 0
    prompt_tokens: int = 0


@dataclass
class RunResult:
    config: str
    mode: str  # "closed" or "open"
    level: float  # concurrency or arrival rate (req/s)
    wall_s: float
    samples: list[Sample] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        ok = [s for s in self.samples if s.ok]
        out: dict[str, object] = {
            "config": self.config,
            "mode": self.mode,
            "level": self.level,
            "requests": len(self.samples),
            "errors": len(self.samples) - len(ok),
            "throughput_rps": round(len(ok) / self.wall_s, 3) if self.wall_s else 0.0,
        }
        for name in ("retrieval_ms", "ttft_ms", "tpot_ms", "total_ms"):
            values = [getattr(s, name) for s in ok if getattr(s, name) > 0]
            for q, label in ((50, "p50"), (95, "p95"), (99, "p99")):
                out[f"{name}_{label}"] = round(percentile(values, q), 2) if values else None
        prompt = sum(s.prompt_tokens for s in ok)
        out["prefix_hit_ratio"] = round(sum(s.prefix_hit_tokens for s in ok) / prompt, 3) if prompt else None
        return out


def questions() -> list[str]:
    lines = (REPO / "indexer" / "sample_questions.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip()]


class Workload:
    """Half the requests repeat an earlier question (as real users do), half are new wordings.

    Without new wordings a naive prompt would be served from the prefix cache as well, since a
    repeated question repeats the whole prompt; the mix keeps both effects in view.
    """

    _WORDINGS = ("{q}", "In one sentence: {q}", "Briefly, {q}", "{q} Answer from the documents.", "Please explain: {q}")

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._seen: list[str] = []
        self._n = 0

    def next(self) -> str:
        self._n += 1
        if self._seen and self._rng.random() < 0.5:
            return self._rng.choice(self._seen)
        base = self._rng.choice(questions())
        wording = self._rng.choice(self._WORDINGS)
        question = f"{wording.format(q=base)} (#{self._n})"
        self._seen.append(question)
        return question


async def one_query(client: RagClient, question: str, max_tokens: int) -> Sample:
    started = time.perf_counter()
    sample = Sample(ok=False)
    try:
        async for event in client.query(question, max_tokens=max_tokens, timeout_s=300):
            kind = event.WhichOneof("event")
            if kind == "retrieval":
                sample.retrieval_ms = event.retrieval.timings.retrieval_total_ms
            elif kind == "token" and sample.ttft_ms == 0:
                sample.ttft_ms = (time.perf_counter() - started) * 1000.0
            elif kind == "final":
                final = event.final
                sample.tpot_ms = final.timings.time_per_output_token_ms
                sample.completion_tokens = final.usage.completion_tokens
                sample.prefix_hit_tokens = final.usage.prefix_cache_hit_tokens
                sample.prompt_tokens = final.usage.prompt_tokens
        sample.ok = True
    except grpc.aio.AioRpcError as exc:
        sample.code = exc.code().name
    sample.total_ms = (time.perf_counter() - started) * 1000.0
    return sample


async def closed_loop(
    client: RagClient, concurrency: int, requests: int, max_tokens: int, seed: int
) -> tuple[list[Sample], float]:
    workload = Workload(seed)
    counter = iter(range(requests))
    samples: list[Sample] = []

    async def worker() -> None:
        for _ in counter:
            samples.append(await one_query(client, workload.next(), max_tokens))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples, time.perf_counter() - started


async def open_loop(
    client: RagClient, rate: float, duration_s: float, max_tokens: int, seed: int
) -> tuple[list[Sample], float]:
    workload = Workload(seed)
    rng = random.Random(seed)
    tasks: list[asyncio.Task[Sample]] = []
    started = time.perf_counter()
    next_at = 0.0
    while True:
        next_at += rng.expovariate(rate)
        if next_at > duration_s:
            break
        await asyncio.sleep(max(0.0, started + next_at - time.perf_counter()))
        tasks.append(asyncio.create_task(one_query(client, workload.next(), max_tokens)))
    samples = list(await asyncio.gather(*tasks))
    return samples, time.perf_counter() - started


async def drive(targets: dict[str, str], args: argparse.Namespace) -> list[RunResult]:
    """Every load level runs on each configuration back to back (same seed, same questions), so
    that slow drifts in the machine's background load hit both sides alike."""
    results = []
    clients = {config: RagClient(target, default_timeout_s=300) for config, target in targets.items()}
    try:
        for client in clients.values():
            await one_query(client, "warm-up question about TCP", args.max_tokens)  # first-request costs
        for concurrency in args.concurrency:
            requests = max(args.min_requests, args.requests_per_client * concurrency)
            for config, client in clients.items():
                samples, wall = await closed_loop(client, concurrency, requests, args.max_tokens, seed=concurrency)
                results.append(RunResult(config, "closed", concurrency, wall, samples))
                print(json.dumps(results[-1].summary()), flush=True)
        for rate in args.rates:
            for config, client in clients.items():
                samples, wall = await open_loop(client, rate, args.duration_s, args.max_tokens, seed=int(rate * 1000))
                results.append(RunResult(config, "open", rate, wall, samples))
                print(json.dumps(results[-1].summary()), flush=True)
    finally:
        for client in clients.values():
            await client.close()
    return results


def plot(summaries: list[dict[str, object]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for mode, xlabel in (("closed", "concurrent clients"), ("open", "arrival rate (req/s, Poisson)")):
        rows = [s for s in summaries if s["mode"] == mode]
        if not rows:
            continue
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
        for metric, ax, title in (
            ("ttft_ms", axes[0], "time to first token (client), ms"),
            ("retrieval_ms", axes[1], "retrieval (server), ms"),
            ("tpot_ms", axes[2], "time per output token, ms"),
        ):
            for config, color in (("ragserve", "tab:blue"), ("naive", "tab:red")):
                series = [r for r in rows if r["config"] == config]
                xs = [float(r["level"]) for r in series]  # type: ignore[arg-type]
                for q, style in (("p50", "-"), ("p95", "--"), ("p99", ":")):
                    ys = [r[f"{metric}_{q}"] or 0 for r in series]
                    ax.plot(xs, ys, style, color=color, marker="o", label=f"{config} {q}")
            ax.set_title(title)
            ax.set_xlabel(xlabel)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.suptitle(f"ragserve vs naive pipeline, {mode} loop (SmolLM2-135M on vLLM CPU, 2 cores)")
        fig.tight_layout()
        path = out / f"load_{mode}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def ratios(summaries: list[dict[str, object]]) -> list[dict[str, object]]:
    rows = []
    for ours in (s for s in summaries if s["config"] == "ragserve"):
        base = next(
            (
                s
                for s in summaries
                if s["config"] == "naive" and s["mode"] == ours["mode"] and s["level"] == ours["level"]
            ),
            None,
        )
        if base is None:
            continue
        row: dict[str, object] = {"mode": ours["mode"], "level": ours["level"]}
        for metric in ("ttft_ms_p50", "ttft_ms_p95", "retrieval_ms_p95", "total_ms_p50"):
            a, b = ours.get(metric), base.get(metric)
            row[f"naive/ragserve {metric}"] = round(b / a, 2) if a and b else None  # type: ignore[operator]
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench-results/load"))
    parser.add_argument("--index", type=Path, help="an index root; default: index the sample corpus")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    if args.quick:
        args.concurrency, args.rates, args.duration_s, args.requests_per_client, args.min_requests = (
            [1, 4],
            [0.5],
            30,
            3,
            6,
        )
    else:
        args.concurrency, args.rates, args.duration_s, args.requests_per_client, args.min_requests = (
            [1, 2, 4],
            [0.25, 0.5, 1.0],
            45,
            4,
            8,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        index = args.index
        if index is None:
            index = Path(tmp) / "index"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "indexer",
                    "build",
                    str(REPO / "indexer" / "sample_docs"),
                    "--out",
                    str(index),
                    "--no-progress",
                ],
                check=True,
            )
        servers: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
        try:
            for config, env in CONFIGS.items():
                servers[config] = start_server(index, env, args.out / f"server-{config}.log")
            results = asyncio.run(drive({config: target for config, (_, target) in servers.items()}, args))
        finally:
            for process, _ in servers.values():
                stop_server(process)
    summaries = [r.summary() for r in results]
    table = ratios(summaries)
    (args.out / "load.json").write_text(
        json.dumps(
            {
                "summaries": summaries,
                "ratios": table,
                "samples": {f"{r.config}-{r.mode}-{r.level}": [asdict(s) for s in r.samples] for r in results},
            },
            indent=1,
        )
    )
    print("\nratios (naive / ragserve; > 1 means ragserve is faster):")
    for row in table:
        print(json.dumps(row))
    for path in plot(summaries, args.out):
        print(f"plot: {path}")


if __name__ == "__main__":
    main()
