"""Settings, read from the environment (RAGSERVE_ prefix) and from CLI flags."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

# The embedded default models; any HF id or local path can be configured instead.
DEFAULT_EMBEDDER = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_GENERATOR_NAME = "SmolLM2-135M-Instruct"


def default_home() -> Path:
    """Where prepared models and the demo index live unless configured otherwise."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "ragserve" if xdg else Path.home() / ".cache" / "ragserve"


def default_generator_path() -> Path:
    return default_home() / "models" / DEFAULT_GENERATOR_NAME


class GeneratorSettings(BaseSettings):
    """vLLM engine settings. Defaults suit the CPU build; the GPU path uses the same fields."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_GENERATOR_", extra="ignore")

    # HF id or local folder; empty means the prepared embedded default.
    model: str = ""
    device: Literal["cpu", "cuda"] = "cpu"
    dtype: str = "auto"
    max_model_len: int = 2048
    # CUDA graphs are not supported by the CPU backend; on a GPU set this to false.
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.80
    # KV cache size for the CPU backend, in GiB (exported as VLLM_CPU_KVCACHE_SPACE).
    cpu_kvcache_space_gib: int = 1
    max_num_seqs: int = 16
    default_max_tokens: int = 128
    max_tokens_limit: int = 1024
    seed: int = 0

    def resolved_model(self) -> str:
        return self.model or str(default_generator_path())


class Settings(BaseSettings):
    """Everything the server needs. Environment variables use the RAGSERVE_ prefix."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_", extra="ignore")

    # Listening: loopback by default; a Unix socket path takes precedence when set.
    host: str = "127.0.0.1"
    port: int = 50051
    uds_path: str = ""

    index_path: Path = Field(default_factory=lambda: default_home() / "index" / "sample")

    embedder_model: str = DEFAULT_EMBEDDER
    embedder_device: Literal["cpu", "cuda"] = "cpu"

    retrieval_budget_ms: int = 70
    default_top_k: int = 5
    max_top_k: int = 50
    max_query_chars: int = 2000
    # HNSW breadth at query time: at least top_k, usually more for recall.
    hnsw_ef_search: int = 64

    # Threads for model calls (embedding), kept off the event loop.
    model_threads: int = 2
    max_in_flight: int = 64
    shutdown_grace_s: float = 10.0

    generator: GeneratorSettings = Field(default_factory=GeneratorSettings)
