"""`prepare-models --int8`'s plumbing: the export runs once in its environment's interpreter, into a
folder beside the float one, published whole; a failed export publishes nothing and says why. The
interpreter here is a fake (a shell script named as such): the real export needs llmcompressor's
environment (BENCHMARKS.md, "8-bit weights on a quiet Zen 4" measured it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragserve.errors import ConfigError
from ragserve.generate.model_prep import int8_folder, is_prepared, prepare_int8

FAKE_EXPORT = """#!/bin/sh
# A fake of int8_export.py's interpreter: "$1" is the script, "$2" the source, "$3" the target.
echo run >> "$(dirname "$0")/../runs"
[ -f "$2/fail" ] && { echo "no Linear layers to quantize" >&2; exit 1; }
mkdir -p "$3" && cp "$2/config.json" "$3/config.json" && echo int8 > "$3/model.safetensors"
"""


def _fake_environment(folder: Path) -> Path:
    (folder / "bin").mkdir(parents=True)
    python = folder / "bin" / "python"
    python.write_text(FAKE_EXPORT)
    python.chmod(0o755)
    (folder / "ragserve-ready").write_text("fake")  # made: prepare_int8 does not install it again
    return folder


def _float_folder(folder: Path, digest: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    (folder / "ragserve-prepared.json").write_text(json.dumps({"adapter_digest": digest}))
    return folder


def test_the_export_runs_once_beside_the_float_folder_and_again_for_new_weights(tmp_path: Path) -> None:
    environment = _fake_environment(tmp_path / "venv")
    source = _float_folder(tmp_path / "models" / "SmolLM2+adapter", "d1")
    target = int8_folder(source)
    assert target == tmp_path / "models" / "SmolLM2+adapter+w8a8"
    assert prepare_int8(source, target, environment) == target
    assert is_prepared(target) and (target / "model.safetensors").read_text() == "int8\n"
    prepare_int8(source, target, environment)  # the same weights: not exported again
    assert (environment / "runs").read_text().count("run") == 1
    _float_folder(source, "d2")  # the float folder prepared anew (another adapter)
    prepare_int8(source, target, environment)
    assert (environment / "runs").read_text().count("run") == 2


def test_a_failed_export_publishes_nothing_and_says_why(tmp_path: Path) -> None:
    environment = _fake_environment(tmp_path / "venv")
    source = _float_folder(tmp_path / "models" / "SmolLM2", "d1")
    (source / "fail").write_text("")
    with pytest.raises(ConfigError, match="no Linear layers to quantize"):
        prepare_int8(source, int8_folder(source), environment)
    assert not int8_folder(source).exists()
    assert [p.name for p in source.parent.iterdir()] == ["SmolLM2"]  # no half-written folder left


def test_only_a_local_model_folder_is_exported(tmp_path: Path) -> None:
    environment = _fake_environment(tmp_path / "venv")
    for source in (Path("HuggingFaceTB/SmolLM2-135M-Instruct"), tmp_path / "empty"):
        with pytest.raises(ConfigError, match="needs a local model folder"):
            prepare_int8(source, int8_folder(source), environment)
    assert not (environment / "runs").exists()
