"""The torch and ONNX Runtime tiers on architecture-identical MiniLM test models, and start-up checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ragserve.config import RerankSettings, Settings
from ragserve.errors import ConfigError
from ragserve.factory import make_reranker, parse_cpus
from ragserve.rerank.cross_encoder import TorchCrossEncoder, pinned
from ragserve.rerank.onnx_cross_encoder import OnnxCrossEncoder

QUERY = "does aspirin reduce the risk of heart attack"
TEXTS = [
    "Aspirin therapy lowered the rate of myocardial infarction in a randomized trial of adults.",
    "The bacterium was grown on agar plates at thirty seven degrees.",
    "Daily low-dose aspirin and cardiovascular events: a meta-analysis of " + "primary prevention trials " * 30,
    "Short.",
]


@pytest.mark.slow  # builds the MiniLM-shaped test models
def test_onnx_int8_tracks_torch_and_exports_once(test_models: dict[str, Path], tmp_path: Path) -> None:
    model = str(test_models["l2"])
    torch_tier = TorchCrossEncoder(model, "RAGSERVE_RERANK_TIER1_MODEL", max_seq_len=64)
    onnx_tier = OnnxCrossEncoder(model, "RAGSERVE_RERANK_TIER1_MODEL", tmp_path, max_seq_len=64, threads=1)
    assert onnx_tier.backend == "onnx-int8" and onnx_tier.random_head
    pairs = torch_tier.encode(QUERY, TEXTS)
    assert max(len(p) for p in pairs) == 64  # truncated to the max sequence length
    assert pairs == onnx_tier.encode(QUERY, TEXTS)
    # Dynamic padding: scoring a pair alone or inside a padded batch gives the same score.
    alone = torch_tier.score(pairs[3:4])
    batched = torch_tier.score(pairs)
    assert abs(float(alone[0]) - float(batched[3])) < 1e-4
    # int8 dynamic quantization moves scores a little, not the order of clearly different pairs.
    q = onnx_tier.score(pairs)
    assert np.max(np.abs(q - batched)) < 0.05 * (np.max(np.abs(batched)) + 1e-3) + 0.01
    exported = sorted(tmp_path.rglob("*.onnx"))
    assert len(exported) == 1 and exported[0].name == "model.int8.onnx"
    mtime = exported[0].stat().st_mtime_ns
    OnnxCrossEncoder(model, "RAGSERVE_RERANK_TIER1_MODEL", tmp_path, max_seq_len=64, threads=1)
    assert exported[0].stat().st_mtime_ns == mtime  # reused, not exported again


def _settings(tmp_path: Path, **rerank: object) -> Settings:
    return Settings(rerank=RerankSettings(onnx_cache_dir=tmp_path, **rerank))  # type: ignore[arg-type]


@pytest.mark.slow  # builds the MiniLM-shaped test models
def test_missing_model_names_model_and_setting(test_models: dict[str, Path], tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-ms-marco-MiniLM-L-6-v2")
    with pytest.raises(ConfigError) as err:
        make_reranker(_settings(tmp_path, mode="one-tier", tier1_model=missing))
    assert missing in str(err.value) and "RAGSERVE_RERANK_TIER1_MODEL" in str(err.value)
    with pytest.raises(ConfigError) as err:
        make_reranker(
            _settings(
                tmp_path,
                mode="two-tier",
                backend="torch",
                tier1_model=str(test_models["l2"]),
                tier2_model=missing,
                allow_random_heads=True,
            )
        )
    assert missing in str(err.value) and "RAGSERVE_RERANK_TIER2_MODEL" in str(err.value)


@pytest.mark.slow  # builds the MiniLM-shaped test models
def test_random_head_models_are_refused_unless_allowed(test_models: dict[str, Path], tmp_path: Path) -> None:
    settings = _settings(tmp_path, mode="one-tier", backend="torch", tier1_model=str(test_models["l2"]))
    with pytest.raises(ConfigError, match="random head"):
        make_reranker(settings)
    assert make_reranker(Settings(rerank=RerankSettings(mode="off"))) is None
    allowed = _settings(
        tmp_path, mode="one-tier", backend="torch", tier1_model=str(test_models["l2"]), allow_random_heads=True
    )
    reranker = make_reranker(allowed)
    assert reranker is not None
    assert "RANDOM-HEAD" in reranker.describe()[0]


def test_cpu_pinning_is_scoped_to_the_call() -> None:
    assert parse_cpus("", "X") is None
    assert parse_cpus("0-2,5", "X") == frozenset({0, 1, 2, 5})
    with pytest.raises(ConfigError, match="RAGSERVE_RERANK_CPUS"):
        parse_cpus("one", "RAGSERVE_RERANK_CPUS")
    before = os.sched_getaffinity(0)
    target = frozenset({min(before)})
    with pinned(target):
        assert os.sched_getaffinity(0) == target
    assert os.sched_getaffinity(0) == before


@pytest.mark.slow  # starts a real server process (loads MiniLM)
def test_server_refuses_to_start_with_a_missing_model(sample_index: Path, tmp_path: Path) -> None:
    """The real `ragserve serve` process: it must exit with a message, not serve a fused order."""
    missing = str(tmp_path / "ms-marco-MiniLM-L-2-v2-not-here")
    env = {
        **os.environ,
        "RAGSERVE_RERANK_MODE": "two-tier",
        "RAGSERVE_RERANK_TIER1_MODEL": missing,
        "RAGSERVE_GENERATION_ENABLED": "false",
        # No metrics listener: the default port may be taken by another server on the machine.
        "RAGSERVE_METRICS_PORT": "0",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "ragserve.cli", "serve", "--port", "0", "--index", str(sample_index)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert missing in proc.stderr and "RAGSERVE_RERANK_TIER1_MODEL" in proc.stderr, proc.stderr[-2000:]
