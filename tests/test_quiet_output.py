"""Command-line tools: a person sees progress and results; third-party chatter goes to the log file."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# What the ONNX quantizer logs per tensor, through the root logger.
QUANTIZER_LINES = ("Quantization parameters for tensor", "Ignore MatMul due to non constant B")

_EMIT = textwrap.dedent(
    """
    import logging, sys, warnings
    from pathlib import Path
    from ragserve.logs import setup_cli_logging

    verbose = sys.argv[1] == "verbose"
    setup_cli_logging(verbose, Path(sys.argv[2]) if len(sys.argv) > 2 else None)
    logging.info('Quantization parameters for tensor:"x" not specified')  # root, as the quantizer does
    logging.getLogger("onnxruntime.quantization").info("onnxruntime info")
    logging.getLogger("sentence_transformers.SentenceTransformer").info("st info")
    logging.getLogger("urllib3.connectionpool").debug("urllib3 debug")
    logging.getLogger("transformers.modeling_utils").warning("third-party warning")
    logging.getLogger("ragserve.generate.model_prep").info("own info")
    logging.getLogger("indexer.build").warning("own warning")
    warnings.warn("a tracer note", UserWarning)
    """
)


def _emit(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    script = tmp_path / "emit.py"
    script.write_text(_EMIT)
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("RAGSERVE_LOG_")}
    run_env.update({"PYTHONPATH": str(REPO), **(env or {})})
    result = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, env=run_env, timeout=60, check=True
    )
    assert result.stdout == ""
    return result.stderr


def test_console_keeps_own_lines_and_third_party_warnings_only(tmp_path: Path) -> None:
    log_file = tmp_path / "logs" / "cli.log"
    console = _emit(tmp_path, "quiet", str(log_file))
    assert "own info" in console and "own warning" in console
    assert "third-party warning" in console
    for chatter in ("Quantization parameters", "onnxruntime info", "st info", "urllib3 debug", "a tracer note"):
        assert chatter not in console
    # The log file keeps the chatter (INFO and up).
    kept = log_file.read_text()
    for line in ("Quantization parameters", "onnxruntime info", "st info", "a tracer note", "own info"):
        assert line in kept
    assert "urllib3 debug" not in kept


def test_verbose_shows_third_party_info_on_the_console(tmp_path: Path) -> None:
    console = _emit(tmp_path, "verbose")
    for line in ("Quantization parameters", "onnxruntime info", "st info", "a tracer note", "own info"):
        assert line in console
    assert "urllib3 debug" not in console


def test_own_level_follows_the_environment(tmp_path: Path) -> None:
    console = _emit(tmp_path, "quiet", env={"RAGSERVE_LOG_LEVEL": "WARNING"})
    assert "own info" not in console and "own warning" in console
    assert "Quantization parameters" not in console


@pytest.mark.slow  # the real indexer CLI, with a fresh ONNX export of MiniLM
def test_indexer_console_carries_no_quantizer_info_lines(tmp_path: Path) -> None:
    """The real CLI on a tiny corpus, exporting and int8-quantizing the embedder afresh, with our
    own INFO lines asked for: the quantizer's per-tensor INFO lines reach the log file only."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "tides.txt").write_text("Tides\nThe moon's gravity raises the tides twice a day.")
    log_file = tmp_path / "index.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        # A fresh ONNX export cache, so the quantizer runs; model files stay where they are.
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "HF_HOME": os.environ.get("HF_HOME", str(Path.home() / ".cache" / "huggingface")),
        "RAGSERVE_LOG_LEVEL": "INFO",
    }
    command = ["build", str(docs), "--out", str(tmp_path / "idx"), "--backend", "onnx", "--log-file", str(log_file)]
    result = subprocess.run(
        [sys.executable, "-m", "indexer", *command],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    assert "published version 1" in result.stdout
    console = result.stdout + result.stderr
    assert "quantizing" in console  # our own INFO line
    for line in QUANTIZER_LINES:
        assert line not in console
    assert " INFO root" not in console
    assert "TracerWarning" not in console
    kept = log_file.read_text()
    assert all(line in kept for line in QUANTIZER_LINES)
