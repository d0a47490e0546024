"""Prompt work per Query by top_k: fitting the context (a tokenizer call per sentence), building the
prompt and rendering the chat template, with the generator's real tokenizer. All of it runs off the
event loop; this says how long a thread is busy with it per request.

Each question gets its own paragraph first and then top_k - 1 other paragraphs of the corpus as
passages (real paragraph lengths; no retrieval, no engine).

    python benchmarks/bench_prompt.py --data ../shared/data/squad2-dev --questions 100
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.harness import percentile
from ragserve.config import GeneratorSettings, RequestSettings, default_of
from ragserve.generate.host import read_host_cpu
from ragserve.generate.vllm_engine import VllmGenerator
from ragserve.prompt import build_prompt
from ragserve.request.context import fit_context
from ragserve.types import Chunk, Passage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="a folder with corpus.jsonl and questions.jsonl")
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--top-k", default="3,10,50")
    args = parser.parse_args()
    corpus = {
        record["_id"]: Chunk(record["_id"], record["_id"], record["text"], title=record["title"])
        for record in map(json.loads, (args.data / "corpus.jsonl").read_text().splitlines())
    }
    questions = [json.loads(line) for line in (args.data / "questions.jsonl").read_text().splitlines()]
    random.Random(0).shuffle(questions)
    questions = questions[: args.questions]
    generator = VllmGenerator(GeneratorSettings())
    generator.load_tokenizer()
    budget = default_of(RequestSettings, "context_token_budget")
    print(f"host: {read_host_cpu().describe()}; {len(questions)} questions; context budget {budget}")
    print("top_k | context ms p50 / p95 / p99 | prompt+render ms p50 / p95 / p99")
    ids = list(corpus)
    for top_k in (int(k) for k in args.top_k.split(",")):
        context_ms: list[float] = []
        render_ms: list[float] = []
        rng = random.Random(top_k)
        for question in questions:
            others = rng.sample([i for i in ids if i != question["doc_id"]], top_k - 1)
            passages = [Passage(corpus[i], 1.0 / (rank + 1)) for rank, i in enumerate([question["doc_id"], *others])]
            started = time.perf_counter()
            context = fit_context(question["question"], passages, budget, generator.count_tokens)
            fitted = time.perf_counter()
            generator.render(build_prompt(question["question"], context.passages))
            done = time.perf_counter()
            context_ms.append((fitted - started) * 1000.0)
            render_ms.append((done - fitted) * 1000.0)
        line = " / ".join(f"{percentile(context_ms, q):.2f}" for q in (50, 95, 99))
        render = " / ".join(f"{percentile(render_ms, q):.2f}" for q in (50, 95, 99))
        print(f"{top_k:5d} | {line} | {render}")


if __name__ == "__main__":
    main()
