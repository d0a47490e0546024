"""Where the in-process engine's time per answer goes, by engine setting, and llama.cpp beside it.

    python benchmarks/bench_decode.py --out bench-results/decode
    python benchmarks/bench_decode.py --out /tmp/decode --configs bf16=dtype=bfloat16 f32=dtype=float32 \
        --llama-python /path/to/venv/bin/python --questions 20

Each configuration (name=K=V,K=V of RAGSERVE_GENERATOR_* fields, lower case) starts the product's
own engine (`VllmGenerator`, the settings the server would choose on this host plus the
overrides) in a process of its own, and asks it the same prompts one at a time, temperature 0:

- answers: SQuAD v2 dev questions with their own paragraph as the one passage, rendered by the
  product's prompt builder (what Query sends), `--answer-tokens` at most: TTFT, whole answer and
  completion tokens, as the server's answers see them;
- decode: a prompt that makes the model write on (a numbered list), `--decode-tokens` tokens:
  the time per token after the first, the engine's decode rate with nothing else in it.

A configuration's `isa=avx2` runs that engine as a host without AVX-512 would: vLLM's AVX2 kernels
(its AVX-512 check answers no), and torch's own kernels, oneDNN's and MKL's capped at AVX2 (their
documented switches: ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS). Pair it with
`dtype=float32`, the dtype such a host gets. What it cannot take away is this host's memory speed
and clock: a stand-in for the instruction set, not for a slower machine (`--cpus` for that).

`--llama-python` runs the same rendered prompts through llama.cpp (llama-cpp-python in that
interpreter) on the bundled GGUF, the weights the embedded default was made from (without the
tuned adapter: its decode speed, not its answers, is what is compared), with the same thread
count. The engine's answers are those of its own weights; the table compares time, not text.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import cpu_name, git_head, load_avg, percentile, write_results  # noqa: E402

DEFAULT_DATA = REPO.parent / "shared" / "data" / "squad2-dev"
DECODE_ASK = "Write the numbers from one to two hundred as words, one per line, and nothing else."


def prompts(data: Path, count: int) -> list[tuple[str, str, str]]:
    """(question, passage title, passage text) for the first `count` answerable questions."""
    corpus: dict[str, dict[str, str]] = {}
    with (data / "corpus.jsonl").open() as f:
        for line in f:
            row = json.loads(line)
            corpus[row["_id"]] = row
    picked: list[tuple[str, str, str]] = []
    with (data / "questions.jsonl").open() as f:
        for line in f:
            q = json.loads(line)
            doc = corpus.get(q["doc_id"])
            if doc is None or q["impossible"]:
                continue
            picked.append((q["question"], doc.get("title", ""), doc["text"]))
            if len(picked) == count:
                break
    return picked


def summary(rows: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in ("ttft_ms", "total_ms", "ms_per_token", "tokens"):
        values = [r[key] for r in rows if key in r]
        if values:
            out[f"{key}_p50"] = percentile(values, 50)
            out[f"{key}_p95"] = percentile(values, 95)
    return out


def _pinned(cpus: str) -> list[str]:
    """`--cpus 0`: the run on one core (taskset), a slow host on a fast one; the engine reads its
    CPUs from its affinity, as it would on a one-core host."""
    return ["taskset", "-c", cpus] if cpus else []


# The kernel libraries' own switches to a narrower instruction set (set before torch is imported).
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def run_engine(name: str, overrides: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    isa = overrides.pop("isa", "")
    spec = json.dumps(
        {
            "isa": isa,
            "overrides": overrides,
            "data": str(args.data),
            "questions": args.questions,
            "answer_tokens": args.answer_tokens,
            "decode_tokens": args.decode_tokens,
        }
    )
    done = subprocess.run(
        [*_pinned(args.cpus), sys.executable, "-m", "benchmarks.decode_worker", "engine", spec],
        cwd=REPO,
        env={**os.environ, **(AVX2_ENV if isa == "avx2" else {})},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:  # a setting the engine refuses is a row of its own, not the end of the run
        print(f"{name}: the engine run failed\n{done.stderr[-4000:]}", file=sys.stderr)
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def run_llama(python: str, rendered: list[str], decode: str, threads: int, args: argparse.Namespace) -> dict[str, Any]:
    spec = json.dumps(
        {
            "rendered": rendered,
            "decode": decode,
            "threads": threads,
            "answer_tokens": args.answer_tokens,
            "decode_tokens": args.decode_tokens,
        }
    )
    done = subprocess.run(
        [*_pinned(args.cpus), python, str(REPO / "benchmarks" / "decode_worker.py"), "llama", spec],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"llama.cpp run failed\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| engine | answers TTFT p50 / p95 (ms) | whole answer p50 / p95 (ms) | tokens p50 "
        "| decode ms per token p50 / p95 | choices |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error'][:200]} | | | | |")
            continue
        a, d = r["answers"], r["decode"]
        lines.append(
            f"| {name} | {a['ttft_ms_p50']:.0f} / {a['ttft_ms_p95']:.0f} | {a['total_ms_p50']:.0f} / "
            f"{a['total_ms_p95']:.0f} | {a['tokens_p50']:.0f} | {d['ms_per_token_p50']:.1f} / "
            f"{d['ms_per_token_p95']:.1f} | {r.get('choices', '')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--answer-tokens", type=int, default=64)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--configs", nargs="*", default=["default="], help="name=K=V,K=V (generator fields)")
    parser.add_argument("--llama-python", default="", help="a Python with llama-cpp-python installed")
    parser.add_argument("--llama-threads", type=int, default=2)
    parser.add_argument("--cpus", default="", help="run every engine on these CPUs only (taskset list)")
    args = parser.parse_args()

    results: dict[str, dict[str, Any]] = {}
    rendered: list[str] = []
    decode = ""
    for config in args.configs:
        name, _, rest = config.partition("=")
        overrides = dict(pair.split("=", 1) for pair in rest.split(",") if pair)
        started = time.perf_counter()
        result = run_engine(name, overrides, args)
        rendered, decode = result.pop("rendered", rendered), result.pop("decode_prompt", decode)
        results[name] = result
        print(f"{name}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if args.llama_python:
        results["llama.cpp"] = run_llama(args.llama_python, rendered, decode, args.llama_threads, args)
    text = "\n".join(
        [
            f"# Decode by engine setting ({cpu_name()}{', CPUs ' + args.cpus if args.cpus else ''}, "
            f"load {load_avg()}, {git_head()})",
            f"{args.questions} SQuAD v2 dev prompts, at most {args.answer_tokens} answer tokens; decode "
            f"probe {args.decode_tokens} tokens",
            "",
            table(results),
        ]
    )
    args.out.mkdir(parents=True, exist_ok=True)
    write_results(args.out, text, results)


if __name__ == "__main__":
    main()
