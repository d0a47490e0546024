"""Engine settings chosen from the host the server runs on; explicit settings always win.

vLLM's CPU defaults cost a great deal on some hosts (measured on two-core hosts, BENCHMARKS.md):
- dtype: vLLM picks bf16 for SmolLM2, which a CPU without native bf16 (no AVX512-BF16, no AMX)
  emulates, several times slower than float32 there. So: bf16 only where the CPU has it.
- OpenMP threads: vLLM's "auto" binding keeps one core per NUMA node for the server. On two cores
  that halves prefill for a server that mostly waits; binding both cores is much faster.
- KV block size: only full blocks are prefix-cached. The CPU backend's default block of 128 tokens
  leaves up to 127 tokens of a repeated prompt to compute again; 32 (a multiple of 32 keeps its
  fast attention kernel) leaves at most 31.

Each choice carries its reason, for the start-up log line and for `Info`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from ragserve.config import GeneratorSettings
from ragserve.errors import ConfigError
from ragserve.reports import EngineChoice

# Flags that mean the CPU computes bf16 natively (Intel AVX512-BF16 / AMX; AMD Zen 4+ has avx512_bf16).
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# Flags worth naming next to a benchmark figure.
REPORTED_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile")
# At or below this many usable CPUs the engine gets all of them (vLLM's auto mode would keep one
# for the server: half the machine on two cores). Above it, vLLM's own NUMA-aware binding is kept.
ALL_CORES_UP_TO = 4
CPU_BLOCK_SIZE = 32
# vLLM's KV block size on CUDA when none is set.
CUDA_BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class HostCpu:
    model: str
    flags: frozenset[str]
    cpus: tuple[int, ...]  # the CPUs this process may run on (its affinity)
    # The container's CPU quota (cgroup v2 cpu.max) in whole CPUs, rounded up; None: no quota.
    quota_cpus: int | None = None

    @property
    def usable(self) -> int:
        """CPUs' worth of time this process may use: its affinity, or less under a quota (on
        Kubernetes without the static CPU manager every node CPU is in the affinity)."""
        return min(len(self.cpus), self.quota_cpus) if self.quota_cpus else len(self.cpus)

    @property
    def usable_cpus(self) -> tuple[int, ...]:
        return self.cpus[: self.usable]

    def describe(self) -> str:
        shown = [f for f in REPORTED_FLAGS if f in self.flags]
        quota = f" (quota {self.quota_cpus})" if self.quota_cpus and self.quota_cpus < len(self.cpus) else ""
        flags = " ".join(shown) or "none of " + " ".join(REPORTED_FLAGS)
        return f"{self.model}; {len(self.cpus)} CPUs{quota}; flags: {flags}"

    @property
    def native_bf16(self) -> bool:
        return any(flag in self.flags for flag in NATIVE_BF16_FLAGS)


@dataclass(frozen=True, slots=True)
class ResolvedEngine:
    """What the engine will be started with; `omp_threads_bind` empty means vLLM's own choice."""

    dtype: str
    omp_threads_bind: str
    block_size: int | None
    choices: tuple[EngineChoice, ...]
    # vLLM's speculative_config, or None for plain decoding.
    speculative_config: dict[str, object] | None = None
    # "process": vLLM's AsyncLLM with its engine-core process; "thread": the engine on a server thread.
    engine_layout: str = "process"
    # The model folder (or hub id) served: the float one, or its int8 export (resolve_weights).
    model: str = ""

    def summary(self) -> str:
        return "; ".join(f"{c.name}={c.value} ({c.reason})" for c in self.choices)


def read_cpu_quota(
    cpu_max: Path = Path("/sys/fs/cgroup/cpu.max"),
    own_cgroup: Path = Path("/proc/self/cgroup"),
    v1_root: Path = Path("/sys/fs/cgroup"),
) -> int | None:
    """Whole CPUs the cgroup's quota allows ("max 100000": none; "150000 100000": 2): cgroup v2's
    cpu.max, or cgroup v1's cpu controller for this process's own group (older container hosts)."""
    limits = [q for q in (_v2_quota(cpu_max), _v1_quota(own_cgroup, v1_root)) if q is not None]
    return min(limits) if limits else None


def _whole_cpus(quota: int, period: int) -> int | None:
    return None if quota <= 0 or period <= 0 else max(1, math.ceil(quota / period))


def _v2_quota(cpu_max: Path) -> int | None:
    try:
        quota, _, period = cpu_max.read_text().strip().partition(" ")
        return None if quota == "max" else _whole_cpus(int(quota), int(period or "100000"))
    except (OSError, ValueError):
        return None


def _v1_quota(own_cgroup: Path, root: Path) -> int | None:
    """cpu.cfs_quota_us over cpu.cfs_period_us of the v1 cpu group this process is in (-1: none)."""
    try:
        for line in own_cgroup.read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "cpu" not in controllers.split(","):
                continue
            # The group under the mount, or the mount itself (a container sees its own group there).
            for group in (root / controllers / path.lstrip("/"), root / "cpu" / path.lstrip("/"), root / "cpu"):
                if (group / "cpu.cfs_quota_us").is_file():
                    quota = int((group / "cpu.cfs_quota_us").read_text())
                    return _whole_cpus(quota, int((group / "cpu.cfs_period_us").read_text()))
    except (OSError, ValueError):
        return None
    return None


def read_host_cpu(cpuinfo: Path = Path("/proc/cpuinfo"), cpu_max: Path = Path("/sys/fs/cgroup/cpu.max")) -> HostCpu:
    model, flags = "unknown CPU", frozenset[str]()
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and model == "unknown CPU":
                model = value.strip()
            elif key == "flags" and not flags:
                flags = frozenset(value.split())
    except OSError:
        pass  # not Linux: no flags known, so the safe choices (float32) are made
    return HostCpu(model, flags, tuple(sorted(os.sched_getaffinity(0))), read_cpu_quota(cpu_max))


def cpu_list(cpus: tuple[int, ...]) -> str:
    """(0, 1, 2, 5) -> "0-2,5", the form VLLM_CPU_OMP_THREADS_BIND takes."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][-1] + 1:
            runs[-1].append(cpu)
        else:
            runs.append([cpu])
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


def _speculation_off_why(settings: GeneratorSettings, host: HostCpu) -> str:
    """Why speculation stays off, or "" where `auto` turns it on."""
    if settings.speculative == "off":
        return "set by RAGSERVE_GENERATOR_SPECULATIVE"
    if settings.speculative == "ngram":
        return ""
    if settings.device != "cpu":
        return "GPU: not measured there; RAGSERVE_GENERATOR_SPECULATIVE=ngram turns it on"
    if host.usable > ALL_CORES_UP_TO:
        return f"not measured on CPU hosts of more than {ALL_CORES_UP_TO} CPUs"
    if settings.engine_layout == "process":
        # BENCHMARKS.md: beside a busy-polling engine-core process the first token got slower.
        return "measured slower with the engine-core process (RAGSERVE_GENERATOR_ENGINE_LAYOUT=process)"
    return ""


def resolve_speculative(settings: GeneratorSettings, host: HostCpu) -> tuple[dict[str, object] | None, EngineChoice]:
    # prompt_lookup_min <= prompt_lookup_max is checked by GeneratorSettings.
    off_why = _speculation_off_why(settings, host)
    if off_why:
        return None, EngineChoice("speculative", "off", off_why)
    config: dict[str, object] = {
        "method": "ngram",
        "num_speculative_tokens": settings.speculative_tokens,
        "prompt_lookup_max": settings.prompt_lookup_max,
        "prompt_lookup_min": settings.prompt_lookup_min,
    }
    value = f"ngram k={settings.speculative_tokens} lookup {settings.prompt_lookup_min}-{settings.prompt_lookup_max}"
    if settings.speculative == "ngram":
        why = "set by RAGSERVE_GENERATOR_SPECULATIVE"
    else:
        why = "a small CPU host: answers copy from the passages, and drafts copied from the prompt pay"
    return config, EngineChoice("speculative", value, why)


def resolve_engine(settings: GeneratorSettings, host: HostCpu) -> ResolvedEngine:
    choices: list[EngineChoice] = []
    speculative, speculative_choice = resolve_speculative(settings, host)
    if settings.device != "cpu":
        dtype, block = settings.dtype, settings.block_size or None
        dtype_why = "GPU: vLLM's choice" if dtype == "auto" else "set by RAGSERVE_GENERATOR_DTYPE"
        block_why = "GPU: vLLM's choice" if block is None else "set by RAGSERVE_GENERATOR_BLOCK_SIZE"
        choices.append(EngineChoice("dtype", dtype, dtype_why))
        choices.append(EngineChoice("block_size", str(block or "auto"), block_why))
        choices.append(speculative_choice)
        layout = "thread" if settings.engine_layout == "thread" else "process"
        explicit = settings.engine_layout != "auto"
        layout_why = "set by RAGSERVE_GENERATOR_ENGINE_LAYOUT" if explicit else "GPU: vLLM's own"
        choices.append(EngineChoice("engine_layout", layout, layout_why))
        model, weights_choice = resolve_weights(settings)
        choices.append(weights_choice)
        return ResolvedEngine(dtype, "", block, tuple(choices), speculative, layout, model)

    if settings.dtype != "auto":
        dtype, why = settings.dtype, "set by RAGSERVE_GENERATOR_DTYPE"
    elif host.native_bf16:
        native = ", ".join(f for f in NATIVE_BF16_FLAGS if f in host.flags)
        dtype, why = "bfloat16", f"the CPU computes bf16 natively ({native})"
    else:
        dtype, why = "float32", "no native bf16 on this CPU (no avx512_bf16/amx_bf16): vLLM's bf16 would be emulated"
    choices.append(EngineChoice("dtype", dtype, why))
    model, weights_choice = resolve_weights(settings)
    choices.append(weights_choice)

    layout, layout_why = resolve_cpu_layout(settings, host, speculative is not None)
    if layout == "thread":
        # vLLM binds OpenMP threads when it starts a worker process; on a server thread there is none.
        bind, why = "", f"engine on a server thread: torch's own OpenMP threads ({host.usable} CPUs), not pinned"
    elif settings.cpu_omp_threads_bind:
        bind, why = settings.cpu_omp_threads_bind, "set by RAGSERVE_GENERATOR_CPU_OMP_THREADS_BIND"
    elif host.usable <= ALL_CORES_UP_TO:
        bind = cpu_list(host.usable_cpus)
        why = f"all {host.usable} usable CPUs: vLLM's auto binding would idle one for a server that mostly waits"
    else:
        bind, why = "", f"vLLM's auto binding ({host.usable} CPUs: one per NUMA node stays with the server)"
    choices.append(EngineChoice("omp_threads_bind", bind or ("none" if layout == "thread" else "auto"), why))

    if settings.block_size:
        if settings.block_size % CPU_BLOCK_SIZE:
            raise ConfigError(
                f"RAGSERVE_GENERATOR_BLOCK_SIZE={settings.block_size}: "
                f"the CPU backend needs a multiple of {CPU_BLOCK_SIZE}"
            )
        block, why = settings.block_size, "set by RAGSERVE_GENERATOR_BLOCK_SIZE"
    else:
        block = CPU_BLOCK_SIZE
        why = "only full KV blocks are prefix-cached: at most 31 tokens of a repeated prefix are computed again"
    choices.append(EngineChoice("block_size", str(block), why))
    choices.append(speculative_choice)
    choices.append(EngineChoice("engine_layout", layout, layout_why))
    if layout == "thread":
        choices.append(resolve_threads(settings, host))
    return ResolvedEngine(dtype, bind, block, tuple(choices), speculative, layout, model)


def resolve_weights(settings: GeneratorSettings) -> tuple[str, EngineChoice]:
    """The folder the engine serves: the float model, or its W8A8 int8 export where asked for."""
    from ragserve.generate.model_prep import int8_folder, is_prepared

    model = settings.resolved_model()
    if settings.weights == "float":
        why = "int8 is RAGSERVE_GENERATOR_WEIGHTS=int8 (measured: faster first visits, slower warm answers)"
        if "weights" in settings.model_fields_set:
            why = "set by RAGSERVE_GENERATOR_WEIGHTS"
        return model, EngineChoice("weights", "float", why)
    local = Path(model).expanduser()
    int8 = int8_folder(local) if local.is_absolute() else None
    if int8 is None or not is_prepared(int8):
        raise ConfigError(
            f"RAGSERVE_GENERATOR_WEIGHTS=int8: no int8 export of {model}; run `ragserve prepare-models --int8`"
        )
    return str(int8), EngineChoice("weights", "int8", "set by RAGSERVE_GENERATOR_WEIGHTS")


def resolve_reuse_pad(settings: GeneratorSettings, block_tokens: int) -> EngineChoice:
    """The blank lines that end a warm passage on a KV block (generate/rendering.py): part of the
    answer's identity, since they are part of the prompt."""
    if settings.reuse_pad_max_tokens == 0:
        return EngineChoice("reuse_pad", "off", "set by RAGSERVE_GENERATOR_REUSE_PAD_MAX_TOKENS")
    return EngineChoice(
        "reuse_pad",
        f"up to {settings.reuse_pad_max_tokens} tokens to a {block_tokens}-token block",
        "only whole KV blocks are prefix-cached: a warm top passage is then reused to its last token",
    )


def resolve_threads(settings: GeneratorSettings, host: HostCpu) -> EngineChoice:
    """The engine thread's OpenMP team size (generate/host_share.py applies it between steps)."""
    if settings.threads:
        return EngineChoice("threads", str(settings.threads), "set by RAGSERVE_GENERATOR_THREADS")
    return EngineChoice(
        "threads",
        f"auto (up to {host.usable})",
        "one fewer per core other processes keep busy: a team waiting on a busy core stalls every step",
    )


def resolve_cpu_layout(settings: GeneratorSettings, host: HostCpu, speculative: bool) -> tuple[str, str]:
    if settings.engine_layout != "auto":
        return settings.engine_layout, "set by RAGSERVE_GENERATOR_ENGINE_LAYOUT"
    if speculative and host.usable <= ALL_CORES_UP_TO:
        # Measured on two cores only; on bigger hosts vLLM's process keeps its NUMA-aware binding.
        return "thread", "speculation on a small CPU host: a separate engine-core process cost most of its gain"
    return "process", "vLLM's own layout (AsyncLLM)"
