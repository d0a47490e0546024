"""Shaping the steps of an engine on a server thread, once at start: it waits before each decoder
layer while an interactive retrieval runs (not only between steps), and a step schedules at most
the prompt tokens this host prefills in about the step target (generate/step_size.py)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ragserve import metrics
from ragserve.generate.engine_thread import ThreadedEngine
from ragserve.generate.step_size import PrefillSpeed, chunk_tokens
from ragserve.reports import EngineChoice
from ragserve.retrieval_first import RetrievalFirst

log = logging.getLogger(__name__)


async def give_way_inside_steps(engine: ThreadedEngine, first: RetrievalFirst, eager: bool) -> EngineChoice:
    """Between the layers of a step too, the engine waits while an interactive retrieval runs
    (eager mode only: a compiled graph runs no Python between its layers). Where it gives way."""
    where = EngineChoice("gives_way", "between steps", "RAGSERVE_GENERATOR_YIELD_TO_RETRIEVAL_MS: retrieval first")
    if not eager:
        return where

    def hook(worker: Any) -> int:
        return int(worker.apply_model(lambda model: _pause_between_layers(model, first.wait_turn)))

    try:
        layers = await engine.call(lambda core: core.collective_rpc(hook)[0])
    except Exception:  # an engine without these hooks still gives way between steps
        log.warning("the engine gives way to retrievals between steps only", exc_info=True)
        return where
    if layers:
        where = EngineChoice("gives_way", f"between steps and before each of {layers} layers", where.reason)
    log.info("the engine gives way to retrievals %s", where.value)
    return where


async def size_steps(
    engine: ThreadedEngine,
    timed_prefill: Callable[[int], Awaitable[tuple[int, float]]],
    step_target_ms: float,
    block: int,
) -> EngineChoice:
    """Measure this host's prefill speed on two uncached prompts (`timed_prefill(words)`: uncached
    tokens and ms), then cap the prompt tokens a step schedules so one step takes about the target."""
    small, large = await timed_prefill(8), await timed_prefill(96)
    speed = PrefillSpeed.fit(small, large)
    most = await engine.call(lambda core: core.vllm_config.scheduler_config.max_num_batched_tokens)
    tokens = chunk_tokens(speed, step_target_ms, block, int(most))
    await engine.call(lambda core: _cap_step_tokens(core, tokens))
    metrics.ENGINE_STEP_TOKENS.set(tokens)
    log.info("generator steps take at most %d prompt tokens (%s)", tokens, speed.describe())
    why = f"about {step_target_ms:g} ms a step at this host's measured speed ({speed.describe()})"
    return EngineChoice("step_tokens", str(tokens), why)


def _cap_step_tokens(engine: Any, tokens: int) -> None:
    """On the engine thread: the scheduler takes at most `tokens` prompt tokens a step (chunked
    prefill, on by default on CPU, cuts longer prompts). Lower than the engine's own limit only, so
    every buffer sized at start still fits."""
    engine.engine_core.engine_core.scheduler.max_num_scheduled_tokens = tokens


def _pause_between_layers(model: Any, wait: Callable[[], object]) -> int:
    """`wait` runs before every decoder layer of `model` (in eager mode each layer is a few
    milliseconds of a step that may take a hundred): a retrieval that arrives mid-step waits at
    most one layer for the CPU. How many layers were found (0: the engine waits between steps only)."""
    layers = [module for module in model.modules() if type(module).__name__.endswith("DecoderLayer")]

    def before_layer(_module: object, _args: object) -> None:  # None: the layer's inputs as they are
        wait()

    for layer in layers:
        layer.register_forward_pre_hook(before_layer)
    return len(layers)
