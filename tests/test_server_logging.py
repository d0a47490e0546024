"""The server's log set-up: one stream, our format, third-party lines at WARNING less the known
noise (everything with --verbose)."""

from __future__ import annotations

import io
import logging

import pytest

from ragserve import logs


def _emit(monkeypatch: pytest.MonkeyPatch, verbose: bool) -> str:
    stream = io.StringIO()
    monkeypatch.setattr(logs.sys, "stderr", stream)
    monkeypatch.setenv("RAGSERVE_LOG_FORMAT", "text")
    monkeypatch.delenv("RAGSERVE_LOG_LEVEL", raising=False)
    logs.setup_logging(verbose=verbose)
    logging.getLogger("ragserve.server.app").info("serving on here")
    logging.getLogger("vllm.model_executor.models.utils").warning(
        "Attempted to load weight %s with dtype %s into a parameter", "w", "float32"
    )
    logging.getLogger("vllm.v1.worker.cpu_worker").warning("%s is not found in LD_PRELOAD.", "libtcmalloc")
    logging.getLogger("vllm.config").info("Initializing a V1 LLM engine with config: ...")
    logging.getLogger("vllm.worker").warning("the KV cache is too small for max_model_len")
    return stream.getvalue()


def test_default_level_keeps_our_lines_and_actionable_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CONFIGURE_LOGGING", raising=False)
    out = _emit(monkeypatch, verbose=False)
    assert "serving on here" in out and "KV cache is too small" in out
    assert "Attempted to load weight" not in out and "with config" not in out and "LD_PRELOAD" not in out
    assert logs.os.environ["VLLM_CONFIGURE_LOGGING"] == "0"  # vLLM's lines come through these handlers


def test_verbose_shows_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    out = _emit(monkeypatch, verbose=True)
    assert "Attempted to load weight w with dtype float32" in out and "with config" in out
