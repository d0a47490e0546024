"""Settings: sections with the variable names of old, cross-field rules, immutability, CLI flags."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from indexer import host_share
from ragserve.client import ClientSettings
from ragserve.config import (
    CacheSettings,
    EmbedderSettings,
    GeneratorSettings,
    RerankSettings,
    Settings,
)

# Every variable the server read before its settings were grouped into sections. Names are an
# interface (deploy files, operators' environments): none may go missing.
FORMER_FLAT_NAMES = [
    "HOST",
    "PORT",
    "UDS_PATH",
    "INDEX_PATH",
    "EMBEDDER_MODEL",
    "EMBEDDER_DEVICE",
    "RETRIEVAL_BUDGET_MS",
    "DEFAULT_TOP_K",
    "CONTEXT_TOKEN_BUDGET",
    "MAX_TOP_K",
    "MAX_QUERY_CHARS",
    "HNSW_EF_SEARCH",
    "INDEX_BACKEND",
    "QDRANT_URL",
    "QDRANT_API_KEY",
    "QDRANT_COLLECTION",
    "QDRANT_SEARCH_THREADS",
    "QDRANT_MIN_SEARCH_MS",
    "QDRANT_TIMEOUT_S",
    "RETRIEVAL_MODE",
    "FUSION",
    "FUSION_DENSE_WEIGHT",
    "RRF_K",
    "FUSION_CANDIDATES",
    "EMBEDDER_BACKEND",
    "EMBEDDER_ONNX_INT8",
    "EMBEDDER_THREADS",
    "INDEX_RELOAD_INTERVAL_S",
    "PROMPT_LAYOUT",
    "MODEL_THREADS",
    "MAX_IN_FLIGHT",
    "MAX_CALL_S",
    "MAX_BUDGET_MS",
    "MAX_SIDE_STREAMS",
    "OVERLOAD_RETRY_AFTER_MS",
    "SHUTDOWN_GRACE_S",
    "GENERATION_ENABLED",
    "ALLOW_NON_LOOPBACK",
    "AUTH_TOKEN",
    "TLS_CERT_FILE",
    "TLS_KEY_FILE",
    "TLS_CLIENT_CA_FILE",
    "TLS_ALLOWED_CLIENT_IDS",
    "KEEPALIVE_TIME_MS",
    "KEEPALIVE_TIMEOUT_MS",
    "KEEPALIVE_MIN_PING_MS",
    "MAX_CONNECTION_AGE_MS",
    "MAX_CONNECTION_AGE_GRACE_MS",
    "MAX_MESSAGE_BYTES",
    "MAX_CONCURRENT_STREAMS",
    "MAX_CONNECTION_IDLE_MS",
    "TRACING_ENABLED",
    "TRACING_OTLP_ENDPOINT",
    "METRICS_PORT",
    "METRICS_HOST",
    "METRICS_MAX_CONNECTIONS",
    "METRICS_TIMEOUT_S",
    "HEALTH_PROBE_INTERVAL_S",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RAGSERVE_"):
            monkeypatch.delenv(name)


def _at(settings: Settings, path: str) -> Any:
    value: Any = settings
    for part in path.split("."):
        value = getattr(value, part)
    return value


def test_every_former_variable_is_still_read() -> None:
    names = Settings.env_names()
    missing = [f"RAGSERVE_{name}" for name in FORMER_FLAT_NAMES if f"RAGSERVE_{name}" not in names]
    assert not missing
    assert len(FORMER_FLAT_NAMES) == 58


@pytest.mark.parametrize(
    ("env", "raw", "path", "expected"),
    [
        ("RAGSERVE_HOST", "0.0.0.0", "transport.host", "0.0.0.0"),
        ("RAGSERVE_PORT", "6000", "transport.port", 6000),
        ("RAGSERVE_UDS_PATH", "/run/r.sock", "transport.uds_path", "/run/r.sock"),
        ("RAGSERVE_MAX_CONCURRENT_STREAMS", "500", "transport.max_concurrent_streams", 500),
        ("RAGSERVE_SHUTDOWN_GRACE_S", "3.5", "transport.shutdown_grace_s", 3.5),
        ("RAGSERVE_AUTH_TOKEN", "secret", "access.auth_token", "secret"),
        ("RAGSERVE_TLS_CLIENT_CA_FILE", "ca.pem", "access.tls_client_ca_file", "ca.pem"),
        ("RAGSERVE_INDEX_PATH", "/srv/index", "index.path", Path("/srv/index")),
        ("RAGSERVE_INDEX_BACKEND", "qdrant", "index.backend", "qdrant"),
        ("RAGSERVE_INDEX_RELOAD_INTERVAL_S", "0", "index.reload_interval_s", 0.0),
        ("RAGSERVE_QDRANT_URL", "http://q:6333", "qdrant.url", "http://q:6333"),
        ("RAGSERVE_QDRANT_TIMEOUT_S", "9", "qdrant.timeout_s", 9),
        ("RAGSERVE_EMBEDDER_MODEL", "/models/e5", "embedder.model", "/models/e5"),
        ("RAGSERVE_EMBEDDER_BACKEND", "torch", "embedder.backend", "torch"),
        ("RAGSERVE_EMBEDDER_THREADS", "3", "embedder.threads", 3),
        ("RAGSERVE_RETRIEVAL_MODE", "bm25", "retrieval.retrieval_mode", "bm25"),
        ("RAGSERVE_FUSION_DENSE_WEIGHT", "0.7", "retrieval.fusion_dense_weight", 0.7),
        ("RAGSERVE_FUSION_WEIGHT_FROM_INDEX", "false", "retrieval.fusion_weight_from_index", False),
        ("RAGSERVE_HNSW_EF_SEARCH", "128", "retrieval.hnsw_ef_search", 128),
        ("RAGSERVE_DEFAULT_TOP_K", "7", "requests.default_top_k", 7),
        ("RAGSERVE_MAX_BUDGET_MS", "900", "requests.max_budget_ms", 900),
        ("RAGSERVE_CONTEXT_TOKEN_BUDGET", "0", "requests.context_token_budget", 0),
        ("RAGSERVE_MAX_IN_FLIGHT", "8", "limits.max_in_flight", 8),
        ("RAGSERVE_MAX_CALL_S", "12", "limits.max_call_s", 12.0),
        ("RAGSERVE_TRACING_ENABLED", "true", "observability.tracing_enabled", True),
        ("RAGSERVE_METRICS_PORT", "0", "observability.metrics_port", 0),
        ("RAGSERVE_HEALTH_PROBE_INTERVAL_S", "0.5", "observability.health_probe_interval_s", 0.5),
        ("RAGSERVE_PROMPT_LAYOUT", "naive", "answer.prompt_layout", "naive"),
        ("RAGSERVE_GENERATION_ENABLED", "false", "answer.generation_enabled", False),
        ("RAGSERVE_GENERATOR_MAX_MODEL_LEN", "4096", "generator.max_model_len", 4096),
        ("RAGSERVE_RERANK_RESERVE_MS", "7", "rerank.reserve_ms", 7.0),
        ("RAGSERVE_CACHE_BACKEND", "off", "cache.backend", "off"),
    ],
)
def test_each_variable_reaches_its_field(
    monkeypatch: pytest.MonkeyPatch, env: str, raw: str, path: str, expected: object
) -> None:
    monkeypatch.setenv(env, raw)
    assert Settings.env_names()[env] == path
    assert _at(Settings(), path) == expected


def test_a_variable_named_like_a_section_is_not_read_as_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSERVE_INDEX", "not json")
    monkeypatch.setenv("RAGSERVE_CACHE", "not json")
    settings = Settings()
    assert settings.index.backend == "hnsw" and settings.cache.backend == "memory"


def test_a_section_given_in_part_reads_the_rest_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSERVE_PORT", "6001")
    settings = Settings(transport={"host": "::1"})  # type: ignore[arg-type]
    assert settings.transport.host == "::1" and settings.transport.port == 6001


def test_an_old_flat_keyword_is_refused_with_its_new_place() -> None:
    with pytest.raises(ValidationError, match=r"index_path is now index\.path"):
        Settings(index_path="/srv/index")  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match=r"max_in_flight is now limits\.max_in_flight"):
        Settings(max_in_flight=3)  # type: ignore[call-arg]


def test_defaults_pass_every_rule() -> None:
    Settings()
    ClientSettings()


# Cross-field rules: each message names the variables to change.


def test_default_top_k_may_not_exceed_max_top_k(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSERVE_DEFAULT_TOP_K", "60")
    with pytest.raises(
        ValidationError, match=r"RAGSERVE_DEFAULT_TOP_K \(60\) must be at most RAGSERVE_MAX_TOP_K \(50\)"
    ):
        Settings()
    monkeypatch.setenv("RAGSERVE_MAX_TOP_K", "60")
    assert Settings().requests.default_top_k == 60  # equal is fine


def test_default_budget_may_not_exceed_the_largest_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSERVE_RETRIEVAL_BUDGET_MS", "500")
    monkeypatch.setenv("RAGSERVE_MAX_BUDGET_MS", "200")
    with pytest.raises(
        ValidationError, match=r"RAGSERVE_RETRIEVAL_BUDGET_MS \(500\) must be at most RAGSERVE_MAX_BUDGET_MS \(200\)"
    ):
        Settings()
    monkeypatch.setenv("RAGSERVE_MAX_BUDGET_MS", "500")
    assert Settings().requests.retrieval_budget_ms == 500  # equal is fine


def test_default_max_tokens_may_not_exceed_the_limit() -> None:
    with pytest.raises(ValidationError, match="RAGSERVE_GENERATOR_DEFAULT_MAX_TOKENS=300 is above"):
        GeneratorSettings(default_max_tokens=300, max_tokens_limit=200)
    assert GeneratorSettings(default_max_tokens=200, max_tokens_limit=200).default_max_tokens == 200


def test_prompt_lookup_window_must_be_ordered() -> None:
    with pytest.raises(ValidationError, match="RAGSERVE_GENERATOR_PROMPT_LOOKUP_MIN=5 is above"):
        GeneratorSettings(prompt_lookup_min=5, prompt_lookup_max=3)
    assert GeneratorSettings(prompt_lookup_min=3, prompt_lookup_max=3).prompt_lookup_min == 3


def test_streams_per_connection_cover_in_flight_and_side_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSERVE_MAX_IN_FLIGHT", "120")
    with pytest.raises(ValidationError, match=r"RAGSERVE_MAX_CONCURRENT_STREAMS \(128\) must be at least .*\(136\)"):
        Settings()
    monkeypatch.setenv("RAGSERVE_MAX_SIDE_STREAMS", "8")
    assert Settings().limits.max_in_flight == 120  # 120 + 8 == 128


def test_client_id_pinning_needs_a_client_ca(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSERVE_TLS_ALLOWED_CLIENT_IDS", "app")
    with pytest.raises(ValidationError, match="RAGSERVE_TLS_CLIENT_CA_FILE"):
        Settings()
    monkeypatch.setenv("RAGSERVE_TLS_CLIENT_CA_FILE", "ca.pem")
    assert Settings().access.tls_allowed_client_ids == "app"


def test_one_hmac_key_source(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="RAGSERVE_CACHE_HMAC_KEY or RAGSERVE_CACHE_HMAC_KEY_FILE, not both"):
        CacheSettings(hmac_key="k" * 16, hmac_key_file=tmp_path / "key")  # type: ignore[arg-type]


# Immutability.


@pytest.mark.parametrize(
    ("make", "field", "value"),
    [
        (lambda: Settings().answer, "generation_enabled", False),
        (lambda: Settings().transport, "port", 1),
        (lambda: Settings().requests, "default_top_k", 1),
        (GeneratorSettings, "max_model_len", 1),
        (RerankSettings, "reserve_ms", 1.0),
        (CacheSettings, "ttl_s", 1.0),
        (EmbedderSettings, "threads", 4),
        (ClientSettings, "tls", True),
    ],
)
def test_settings_are_immutable(make: Any, field: str, value: object) -> None:
    settings = make()
    with pytest.raises(ValidationError, match="frozen"):
        setattr(settings, field, value)


def test_a_changed_copy_leaves_the_original() -> None:
    settings = Settings()
    changed = settings.model_copy(
        update={
            "limits": settings.limits.model_copy(update={"max_in_flight": 4}),
            "answer": settings.answer.model_copy(update={"generation_enabled": False}),
        }
    )
    assert changed.limits.max_in_flight == 4 and not changed.answer.generation_enabled
    assert settings.limits.max_in_flight == 64 and settings.answer.generation_enabled


# `ragserve serve` flags over the environment.


def _served_settings(monkeypatch: pytest.MonkeyPatch, *args: str) -> Settings:
    from ragserve import cli
    from ragserve.server import app

    seen: list[Settings] = []

    async def fake_serve(settings: Settings) -> None:
        seen.append(settings)

    monkeypatch.setattr(app, "serve", fake_serve)
    monkeypatch.setattr(cli.serve, "setup_logging", lambda default_format="json", verbose=False: None)
    result = CliRunner().invoke(cli.app, ["serve", *args])
    assert result.exit_code == 0, result.output
    return seen[0]


def test_serve_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RAGSERVE_HOST", "127.0.0.2")
    monkeypatch.setenv("RAGSERVE_PORT", "6002")
    monkeypatch.setenv("RAGSERVE_INDEX_BACKEND", "qdrant")
    settings = _served_settings(
        monkeypatch, "--host", "::1", "--port", "7000", "--uds", "/run/x.sock", "--index", str(tmp_path)
    )
    assert settings.transport.host == "::1" and settings.transport.port == 7000
    assert settings.transport.uds_path == "/run/x.sock"
    assert settings.index.path == tmp_path and settings.index.backend == "qdrant"


def test_serve_without_flags_keeps_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSERVE_PORT", "6003")
    monkeypatch.setenv("RAGSERVE_INDEX_PATH", "/srv/index")
    settings = _served_settings(monkeypatch)
    assert settings.transport.host == "127.0.0.1" and settings.transport.port == 6003
    assert settings.index.path == Path("/srv/index")


def test_serve_reports_a_broken_rule_as_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from ragserve import cli

    monkeypatch.setattr(cli.serve, "setup_logging", lambda default_format="json", verbose=False: None)
    monkeypatch.setenv("RAGSERVE_DEFAULT_TOP_K", "99")
    result = CliRunner().invoke(cli.app, ["serve"])
    assert result.exit_code == 2
    assert "RAGSERVE_DEFAULT_TOP_K" in result.output


# The indexer's embedder comes from the server's factory.


def test_indexer_builds_its_embedder_through_the_factory(monkeypatch: pytest.MonkeyPatch) -> None:
    from indexer import embedding as indexer_embedding
    from ragserve import factory

    calls: list[tuple[EmbedderSettings, bool]] = []

    def fake_make_embedder(cfg: EmbedderSettings, *, indexing: bool = False) -> object:
        calls.append((cfg, indexing))
        return object()

    monkeypatch.setattr(factory, "make_embedder", fake_make_embedder)
    monkeypatch.setenv("RAGSERVE_EMBEDDER_THREADS", "5")  # the indexer's own choices win
    indexer_embedding.load_embedder("/models/e5", "onnx", "cuda", False)
    indexer_embedding.load_embedder("/models/e5", "torch", "cuda", True)
    (onnx, onnx_indexing), (torch, _) = calls
    assert onnx_indexing and onnx.backend == "onnx" and onnx.device == "cpu" and not onnx.onnx_int8
    assert onnx.threads == host_share.threads and onnx.model == "/models/e5"  # --threads, or 0 when not run
    assert torch.backend == "torch" and torch.device == "cuda"


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"RAGSERVE_ACCESS_FIELD": "groups", "RAGSERVE_ACCESS_PUBLIC_VALUE": "*"}, "every document public"),
        ({"RAGSERVE_ACCESS_FIELD": "groups", "RAGSERVE_ACCESS_GRANTS": '{"*": ["eng"]}'}, "not a caller name"),
    ],
)
def test_a_star_where_it_would_turn_access_off_or_name_nobody_is_refused(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], says: str
) -> None:
    from ragserve.config.filters import GrantSettings

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=says):
        GrantSettings()
    monkeypatch.setenv("RAGSERVE_ACCESS_PUBLIC_VALUE", "public")
    monkeypatch.setenv("RAGSERVE_ACCESS_GRANTS", '{"admin-svc": ["*"]}')  # "*" as a value reads everything
    assert GrantSettings().grant_table() == {"admin-svc": ("*",)}
