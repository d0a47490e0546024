"""The generator's settings (RAGSERVE_GENERATOR_*): the engine in process, or vLLM servers."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ragserve.addresses import is_loopback, normalize_http_url
from ragserve.config.base import SHIPPED_ADAPTER, default_generator_path, merged_generator_path


class GeneratorSettings(BaseSettings):
    """vLLM engine settings. Defaults suit the CPU build; the GPU path uses the same fields."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_GENERATOR_", extra="forbid", frozen=True)

    # HF id or local folder; empty means the prepared embedded default.
    model: str = ""
    device: Literal["cpu", "cuda"] = "cpu"
    # auto: on CPU, bfloat16 only where the CPU has native bf16, else float32 (generate/host.py);
    # on CUDA, vLLM's choice.
    dtype: str = "auto"
    # The LoRA adapter `ragserve prepare-models` merges into the model once, into a folder of its
    # own that is then served: "default" the one the repository ships for the embedded default
    # (short answers copied from the passages with their citation, or the decline sentence;
    # NOTICE); "none" the base model's free-form answers; or an adapter folder written by
    # `ragserve-index tune-generator`. With RAGSERVE_GENERATOR_MODEL set, "default" means none.
    adapter: str = "default"
    # The weights served on a CPU: "float" the model folder; "int8" its W8A8 export, which
    # `ragserve prepare-models --int8` writes beside it (vLLM's oneDNN int8 kernels). int8 is not
    # the default: on an AVX-512 host it made first visits faster and warm answers slower
    # (BENCHMARKS.md, "8-bit weights on a quiet Zen 4").
    weights: Literal["float", "int8"] = "float"
    max_model_len: int = 2048
    # CUDA graphs are not supported by the CPU backend; on a GPU set this to false.
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.80
    # KV cache size for the CPU backend, in GiB (exported as VLLM_CPU_KVCACHE_SPACE).
    cpu_kvcache_space_gib: int = 1
    # CPUs for the CPU backend's OpenMP threads (exported as VLLM_CPU_OMP_THREADS_BIND), e.g. "0" or
    # "0-1"; empty: chosen from the host (all usable CPUs on small hosts, else vLLM's auto binding).
    # Only with the engine in its own processes (engine_layout process): with the engine on a server
    # thread (the auto layout on hosts of up to 4 CPUs with speculation) it is ignored, nothing is
    # pinned, and `threads` sets how many threads the engine runs.
    cpu_omp_threads_bind: str = ""
    # KV cache block size in tokens (0: 32 on CPU, vLLM's default on CUDA). Only full blocks are
    # prefix-cached; the CPU backend needs a multiple of 32. With remote servers: the servers'
    # --block-size (0: 32, a whole number of blocks of vLLM's CUDA default 16 too).
    block_size: int = Field(default=0, ge=0)
    # Blank lines after a top passage warming pre-filled, so that what every question about it
    # shares ends on a KV block and it is reused whole, when that takes at most this many tokens
    # (a longer pad takes more KV room from other passages than it saves). 0: never (docs/ttft.md).
    reuse_pad_max_tokens: int = Field(default=16, ge=0, le=1024)
    # Prompt-lookup (n-gram) speculative decoding (drafts copied from the prompt). auto: on for CPU
    # hosts of up to 4 CPUs, with the engine on a server thread, where it was measured to pay
    # (BENCHMARKS.md); off elsewhere (GPU and bigger hosts: not measured). ngram: on; off: off.
    speculative: Literal["auto", "ngram", "off"] = "auto"
    speculative_tokens: int = Field(default=4, ge=1, le=16)
    prompt_lookup_max: int = Field(default=4, ge=1)
    prompt_lookup_min: int = Field(default=2, ge=1)
    # Where vLLM's engine core runs. process: its own process (vLLM's AsyncLLM, the GPU layout);
    # thread: a thread of the server process (no busy-polling core process beside the model's
    # OpenMP threads); auto: chosen from the host and the other settings (generate/host.py).
    engine_layout: Literal["auto", "process", "thread"] = "auto"
    # Threads of the engine on a server thread (engine_layout thread). 0: every usable CPU, one fewer
    # per core other processes keep busy, checked twice a second (generate/host_share.py); N: always N.
    threads: int = Field(default=0, ge=0)
    # With the engine on a server thread: the longest it waits in a row between two steps while an
    # interactive retrieval runs (ragserve/retrieval_first.py), so retrieval keeps its budget beside
    # other callers' answers and warming. 0: it never waits.
    yield_to_retrieval_ms: float = Field(default=100.0, ge=0)
    # With the engine on a server thread: about how long one engine step may take. Prompts prefill
    # in chunks sized from this host's prefill speed, measured at start (generate/step_size.py), so
    # a Query waits behind at most one short step of warming. 0 (the default): vLLM's own (whole
    # prompts in one step); chunks cost first tokens more than they saved, measured (BENCHMARKS.md,
    # "The retrieval budget beside the engine"), once the engine gave way between layers.
    step_target_ms: float = Field(default=0.0, ge=0)
    max_num_seqs: int = 16
    # priority: interactive requests run before batch ones in the engine's waiting queue (vLLM's
    # priority scheduling); fcfs: arrival order for all.
    scheduling_policy: Literal["priority", "fcfs"] = "priority"
    # One engine call (a step, adding a request) running longer than this turns health NOT_SERVING
    # until it ends: far above any step a healthy engine takes (docs: BENCHMARKS.md, TTFT).
    stall_s: float = Field(default=30.0, gt=0)
    default_max_tokens: int = Field(default=128, ge=1)
    max_tokens_limit: int = Field(default=1024, ge=1)
    seed: int = 0

    # local: the vLLM engine in this process (the default). remote: vLLM OpenAI-compatible servers
    # (`python -m vllm.entrypoints.openai.api_server`); no engine starts here (docs/remote.md).
    backend: Literal["local", "remote"] = "local"
    # remote: comma-separated server base URLs (http://host:8000), or one router's URL.
    remote_urls: str = ""
    # The name the servers serve the model under (/v1/models); empty: the one whose name or folder
    # matches `model` (the tokenizer here must be the servers' model's).
    remote_model: str = ""
    # Several URLs: document (rendezvous hashing on the prompt's top passage, so questions about
    # one document land where its KV sits) or round_robin (for comparison). One URL is used as is.
    remote_routing: Literal["document", "round_robin"] = "document"
    # The header carrying the routing key to a router (vLLM router consistent_hash policy, or the
    # production-stack router's session policy: --session-key with the same name). Never a client id.
    remote_routing_header: str = "x-session-id"
    # Bearer token for servers started with --api-key.
    remote_api_key: SecretStr | None = None
    # A server that does not accept a connection by then is down for this call (the next one is asked).
    remote_connect_timeout_s: float = Field(default=2.0, gt=0)
    # Connections per server (HTTP/1.1: one stream each); 0: RAGSERVE_MAX_IN_FLIGHT.
    remote_pool_size: int = Field(default=0, ge=0)
    # Idle connections close before the server's own keep-alive (uvicorn: 5 s) drops them.
    remote_keepalive_s: float = Field(default=4.0, gt=0)
    # A second server gets the same prompt when the first has sent no token by then; the first token
    # wins, the other is aborted. 0: the first server's measured TTFT p95 (after 20 answers; no
    # hedge before); negative: never hedge.
    remote_hedge_after_ms: float = 0.0
    # A server failing this many calls or probes in a row is left alone until a probe succeeds.
    remote_breaker_failures: int = Field(default=2, ge=1)
    # Send each request's class as vLLM's `priority` (the servers must run --scheduling-policy
    # priority, else they refuse it).
    remote_priority: bool = False
    # The longest silence a streamed answer may have (before its first token too), and the limit on
    # one warming stream: past it the server has failed the call (the next one is asked).
    remote_stall_s: float = Field(default=30.0, gt=0)
    # One server's bring-up at start (its model, connections, the template prefix). The sidecar
    # serves once one server is up; a server still coming up joins when it is ready.
    remote_start_timeout_s: float = Field(default=120.0, gt=0)
    # Send RAGSERVE_GENERATOR_REMOTE_API_KEY over plain http to a server that is not on loopback.
    # Off: refused at start (the key would cross the network readable), as for the gRPC token.
    remote_allow_plain_http_key: bool = False

    @model_validator(mode="after")
    def _lookup_range(self) -> Self:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"RAGSERVE_GENERATOR_PROMPT_LOOKUP_MIN={self.prompt_lookup_min} is above "
                f"RAGSERVE_GENERATOR_PROMPT_LOOKUP_MAX={self.prompt_lookup_max}"
            )
        if self.backend == "remote" and not self.remote_url_list():
            raise ValueError("RAGSERVE_GENERATOR_BACKEND=remote needs RAGSERVE_GENERATOR_REMOTE_URLS")
        bad = [url for url in self.remote_url_list() if not url.startswith(("http://", "https://"))]
        if bad:
            raise ValueError(f"RAGSERVE_GENERATOR_REMOTE_URLS: not an http(s) URL: {', '.join(bad)}")
        exposed = [
            url
            for url in self.remote_url_list()
            if url.startswith("http://") and not is_loopback(urlsplit(url).hostname or "")
        ]
        if self.remote_api_key is not None and exposed and not self.remote_allow_plain_http_key:
            raise ValueError(
                "RAGSERVE_GENERATOR_REMOTE_API_KEY would travel in clear text to "
                f"{', '.join(exposed)}: use https, or set RAGSERVE_GENERATOR_REMOTE_ALLOW_PLAIN_HTTP_KEY=true"
            )
        # A request that sets no max_tokens would otherwise be refused for the server's own default.
        if self.default_max_tokens > self.max_tokens_limit:
            raise ValueError(
                f"RAGSERVE_GENERATOR_DEFAULT_MAX_TOKENS={self.default_max_tokens} is above "
                f"RAGSERVE_GENERATOR_MAX_TOKENS_LIMIT={self.max_tokens_limit}"
            )
        return self

    def resolved_model(self) -> str:
        """The folder served: the base model, or the base with the adapter merged in."""
        adapter = self.adapter_folder()
        if adapter is None:
            return self.model or str(default_generator_path())
        return str(merged_generator_path(self.base_model_folder(), adapter))

    def base_model_folder(self) -> Path:
        return Path(self.model).expanduser() if self.model else default_generator_path()

    def adapter_folder(self) -> Path | None:
        if self.adapter == "none" or (self.adapter == "default" and self.model):
            return None
        return SHIPPED_ADAPTER if self.adapter == "default" else Path(self.adapter).expanduser()

    def remote_url_list(self) -> list[str]:
        """The servers, each once (one spelling per server: see `normalize_http_url`)."""
        urls = [normalize_http_url(url) for url in self.remote_urls.split(",") if url.strip()]
        return list(dict.fromkeys(urls))
