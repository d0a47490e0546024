"""A reader folder: the ONNX model, its tokenizer files and `manifest.json`, which says what the
folder holds and is checked before anything in it is loaded.

    manifest.json   {"format": "ragserve-reader", "format_version": 1, "name": ..., "onnx": "model-int8.onnx",
                     "output": "span_logits", "max_length": 256, "max_answer_tokens": 30,
                     "no_answer_threshold": <float>, "files": {<file>: <sha256>, ...},
                     plus provenance (base weights, training data, held-out figures, licence)}
    model-int8.onnx inputs input_ids, attention_mask, token_type_ids (batch, seq); output
                    span_logits (batch, seq, 2): start and end logits per token
    tokenizer.json, tokenizer_config.json, vocab.txt, special_tokens_map.json, config.json

Every file in `files` must be present with that digest; a folder that does not match is refused
with ReaderLoadError naming what is wrong.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragserve.digests import sha256_file
from ragserve.errors import ConfigError

MANIFEST = "manifest.json"
FORMAT = "ragserve-reader"
FORMAT_VERSION = 1
OUTPUT = "span_logits"
DEFAULT_READER_DIR = Path(__file__).resolve().parent / "default"
# A question longer than this (in tokens) is cut: the passage needs the room.
MAX_QUESTION_TOKENS = 64
# The shortest pair a reader may take: the longest question, [CLS] and two [SEP], and one passage
# token (shorter, every long question would fail to tokenize).
MIN_MAX_LENGTH = MAX_QUESTION_TOKENS + 4


class ReaderLoadError(ConfigError):
    """A reader folder is missing, corrupt, or not a reader this code can run."""


@dataclass(frozen=True, slots=True)
class ReaderSpec:
    """The checked part of a reader folder's manifest."""

    folder: Path
    name: str
    onnx: Path
    onnx_sha256: str
    max_length: int
    max_answer_tokens: int
    no_answer_threshold: float
    manifest: dict[str, Any]


def _fail(folder: Path, what: str) -> ReaderLoadError:
    return ReaderLoadError(f"reader at {folder}: {what}")


def read_spec(folder: Path, verify_files: bool = True) -> ReaderSpec:
    """The folder's manifest, checked: format, values in range, every listed file and its digest."""
    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _fail(folder, f"no {MANIFEST} (not a reader folder)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(folder, f"{MANIFEST} cannot be read: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise _fail(folder, f"{MANIFEST} does not say format {FORMAT!r}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise _fail(folder, f"format_version {manifest.get('format_version')!r}, this code reads {FORMAT_VERSION}")
    if manifest.get("output") != OUTPUT:
        raise _fail(folder, f"output {manifest.get('output')!r}, expected {OUTPUT!r}")
    max_length, max_answer = manifest.get("max_length"), manifest.get("max_answer_tokens")
    if not (isinstance(max_length, int) and MIN_MAX_LENGTH <= max_length <= 512):
        raise _fail(folder, f"max_length {max_length!r} is not a whole number in {MIN_MAX_LENGTH}..512")
    if not (isinstance(max_answer, int) and 1 <= max_answer <= max_length):
        raise _fail(folder, f"max_answer_tokens {max_answer!r} is not a whole number in 1..max_length")
    threshold = manifest.get("no_answer_threshold")
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not math.isfinite(threshold):
        raise _fail(folder, f"no_answer_threshold {threshold!r} is not a finite number")
    files = manifest.get("files")
    onnx = manifest.get("onnx")
    if not isinstance(files, dict) or not isinstance(onnx, str) or onnx not in files:
        raise _fail(folder, "files must list every file with its sha256, the onnx model among them")
    for name, digest in files.items():
        if not isinstance(name, str) or "/" in name or "\\" in name or name.startswith("."):
            raise _fail(folder, f"file name {name!r} is not a plain file name")
        target = folder / name
        if not target.is_file():
            raise _fail(folder, f"{name} is listed but missing")
        if verify_files and sha256_file(target) != digest:
            raise _fail(folder, f"{name} does not match its sha256 in {MANIFEST} (corrupt or replaced)")
    return ReaderSpec(
        folder=folder,
        name=str(manifest.get("name", "reader")),
        onnx=folder / onnx,
        onnx_sha256=str(files[onnx]),
        max_length=max_length,
        max_answer_tokens=max_answer,
        no_answer_threshold=float(threshold),
        manifest=manifest,
    )
