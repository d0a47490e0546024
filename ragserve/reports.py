"""What the server reports of its parts (Info, health and the metrics): the generator's state, the
host share, warming, and each engine setting with its reason."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """One generation server of a remote pool, as Info and the metrics report it."""

    url: str
    up: bool
    in_flight: int


@dataclass(frozen=True, slots=True)
class HostShareState:
    """The local engine's share of its CPUs, as Info reports it (generate/host_share.py)."""

    usable_cpus: int
    # CPUs' worth of time other processes used on those CPUs in the last sample.
    neighbour_cpus: float
    engine_threads: int
    # The thread count follows the neighbours (RAGSERVE_GENERATOR_THREADS=0).
    adaptive: bool


@dataclass(frozen=True, slots=True)
class GeneratorStatus:
    """What a generator says about where it runs (Info, health and the pace baseline read it)."""

    # The engine runs on this host's CPUs (its pace is this host's; False for vLLM servers).
    on_this_host: bool
    # Each generation server of a remote pool (empty for the engine in process).
    servers: tuple[ReplicaState, ...] = ()
    # The local engine's share of its CPUs (None: not watched, or not on this host).
    host_share: HostShareState | None = None
    # The engine orders its waiting requests by priority (warming's then go after every Query's).
    by_priority: bool = False


@dataclass(frozen=True, slots=True)
class WarmState:
    """What warming did for the serving version (Info and the metrics report it)."""

    version: str = ""
    passages: int = 0
    tokens: int = 0
    left_out: int = 0  # passages of the version that stayed cold (past the share, or too long to reuse)
    done: bool = False
    seconds: float = 0.0
    planned: int = 0  # passages this run means to try (passages + left_out of it: how far it is)


@dataclass(frozen=True, slots=True)
class PipelineInfo:
    """What a loaded pipeline serves with, for Info (RagPipeline.info)."""

    index_version: str
    index_chunks: int
    embedder_model: str
    rerank_tiers: tuple[str, ...]
    generator_model: str = ""
    generator_unfinished_requests: int = 0
    generator_settings: tuple[EngineChoice, ...] = ()
    host_cpu: str = ""
    generator_pace: str = ""
    generator: GeneratorStatus = GeneratorStatus(on_this_host=False)
    warming: WarmState = WarmState()
    reader_model: str = ""
    reader_threshold: float = 0.0
    index_served_s: float = 0.0  # how long the serving version has served here
    last_reload_refusal: str = ""  # the last newly published version refused, and why


@dataclass(frozen=True, slots=True)
class EngineChoice:
    """One engine setting as resolved at start-up, and why (an explicit setting, or the host)."""

    name: str
    value: str
    reason: str
