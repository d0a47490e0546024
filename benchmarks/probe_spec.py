"""Where does n-gram speculation lose on the CPU engine? vLLM offline, product prompts, one setting per run.

    python benchmarks/probe_spec.py --block-size 32 --spec off --context budget
    python benchmarks/probe_spec.py --block-size 32 --spec on --context budget
    python benchmarks/probe_spec.py --spec on --in-process      # engine in this process (no EngineCore)
    python benchmarks/probe_spec.py --spec on --uni-executor    # EngineCore process, no worker process

Builds the product's prompt (ragserve.prompt) over one SQuAD paragraph per question (whole, or its
first two sentences as a stand-in for the context budget), then per question: a max_tokens=1 call
(prefill; the template prefix is cached from warm-up) and a max_tokens=64 call on the same prompt
(now cached: mostly decode). Prints one JSON line: p50 of each and ms per generated token. One
setting per process, so the engines never share the two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def product_prompts(data: Path, count: int, context: str, tokenizer: object) -> list[str]:
    from ragserve.prompt import build_prompt
    from ragserve.types import Chunk, Passage

    corpus = {d["_id"]: d for d in map(json.loads, (data / "corpus.jsonl").open())}
    questions = [q for q in map(json.loads, (data / "questions.jsonl").open()) if not q["impossible"]][:count]
    prompts = []
    for q in questions:
        doc = corpus[q["doc_id"]]
        text = doc["text"] if context == "full" else ". ".join(doc["text"].split(". ")[:2])
        chunk = Chunk(q["doc_id"], q["doc_id"], text, title=doc.get("title", ""))
        prompt = build_prompt(q["question"], [Passage(chunk, 1.0, 1)])
        messages = [{"role": "system", "content": prompt.system}, {"role": "user", "content": prompt.user}]
        prompts.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))  # type: ignore[attr-defined]
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--spec", choices=["on", "off"], default="off")
    parser.add_argument("--context", choices=["budget", "full"], default="budget")
    parser.add_argument("--questions", type=int, default=12)
    parser.add_argument("--in-process", action="store_true", help="run the engine in this process")
    parser.add_argument(
        "--uni-executor",
        action="store_true",
        help="the model worker inside the engine-core process (no worker process)",
    )
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "squad2-dev")
    args = parser.parse_args()

    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if args.in_process:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams

    from ragserve.config import default_generator_path
    from ragserve.generate.host import read_host_cpu

    engine: dict[str, object] = {
        "model": str(default_generator_path()),
        "dtype": "float32",
        "block_size": args.block_size,
        "enable_prefix_caching": True,
        "max_model_len": 2048,
        "enforce_eager": True,
    }
    if args.in_process or args.uni_executor:
        engine["distributed_executor_backend"] = "uni"
    if args.spec == "on":
        engine["speculative_config"] = {
            "method": "ngram",
            "num_speculative_tokens": 4,
            "prompt_lookup_max": 4,
            "prompt_lookup_min": 2,
        }
    llm = LLM(**engine)
    prompts = product_prompts(args.data, args.questions, args.context, llm.get_tokenizer())
    first, answer = SamplingParams(max_tokens=1, temperature=0), SamplingParams(max_tokens=64, temperature=0)
    llm.generate(prompts[:2], answer, use_tqdm=False)  # warm-up, and the template prefix cached
    prefill_ms, answer_ms, tokens = [], [], []
    for prompt in prompts[2:]:
        started = time.perf_counter()
        llm.generate([prompt], first, use_tqdm=False)
        prefill_ms.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        out = llm.generate([prompt], answer, use_tqdm=False)
        answer_ms.append((time.perf_counter() - started) * 1000)
        tokens.append(len(out[0].outputs[0].token_ids))
    figures = {
        "cpu": read_host_cpu().describe(),
        "block": args.block_size,
        "spec": args.spec,
        "context": args.context,
        "engine": "in-process"
        if args.in_process
        else "engine-core process" + (", uni executor" if args.uni_executor else ""),
        "prefill_p50_ms": round(statistics.median(prefill_ms)),
        "answer_p50_ms": round(statistics.median(answer_ms)),
        "tokens_mean": round(statistics.mean(tokens), 1),
        "ms_per_token": round(sum(answer_ms) / sum(tokens), 1),
    }
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
