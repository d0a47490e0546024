"""A tuned cross-encoder shipped inside an index version, loaded and checked like its index files.

Layout in a version folder (every file listed, with its sha256, in the manifest's `files`):

    reranker/model.int8.onnx    the tuned cross-encoder, ONNX int8 (the ONNX cross-encoder's export)
    reranker/config.json, tokenizer files

and in the manifest `tuned_reranker = {"dir": "reranker", "onnx": "reranker/model.int8.onnx",
"base": <model it was tuned from>, "layers": 2, "max_seq_len": 256, "ce_weight": 0.5,
"beats_fused": true}`: `ce_weight` is the fitted weight of the cross-encoder's score against the
fused score (rerank/blend.py), `beats_fused` whether that blend beat the fused order on held-back
queries. The model is reported as `tuned_reranker_id(base, sha256 of the ONNX file)`. Anything off
(a missing or unlisted file, a checksum, a malformed entry, a random-head test model, a model that
does not run) raises IndexLoadError: the version is refused exactly like a corrupt index file, at
start-up or on hot reload.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragserve.errors import IndexLoadError
from ragserve.index.format import MANIFEST, Manifest, check_file_name, require_all_listed
from ragserve.pretrained import check_model_file_size

if TYPE_CHECKING:
    from ragserve.rerank.cross_encoder import OnnxCrossEncoder

TUNED_DIR = "reranker"
TUNED_ONNX = f"{TUNED_DIR}/model.int8.onnx"
_SPEC_KEYS: dict[str, type | tuple[type, ...]] = {
    "dir": str,
    "onnx": str,
    "base": str,
    "layers": int,
    "max_seq_len": int,
    "ce_weight": (int, float),
    "beats_fused": bool,
}


def tuned_reranker_id(base: str, onnx_sha256: str) -> str:
    """How a version's tuned cross-encoder is reported: the base and the model's digest."""
    return f"{base}+reranker-{onnx_sha256[:16]}"


@dataclass(frozen=True, slots=True)
class TunedCrossEncoder:
    """A version's tuned cross-encoder and what its tuning found."""

    encoder: OnnxCrossEncoder
    ce_weight: float
    beats_fused: bool
    model_id: str
    max_seq_len: int


def _fail(folder: Path, what: str) -> IndexLoadError:
    return IndexLoadError(f"index at {folder}: tuned_reranker: {what}")


def _check_spec(folder: Path, manifest: Manifest) -> dict[str, Any]:
    spec = manifest.tuned_reranker
    for key, kind in _SPEC_KEYS.items():
        value = spec.get(key)
        # bool is an int to isinstance: only beats_fused may be one.
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise _fail(folder, f"{key} is missing or of the wrong type ({value!r})")
    try:
        check_file_name(spec["dir"])
        check_file_name(spec["onnx"])
    except ValueError as exc:
        raise _fail(folder, str(exc)) from None
    if not spec["onnx"].startswith(spec["dir"] + "/") or spec["onnx"] not in manifest.files:
        raise _fail(folder, f"model {spec['onnx']} is not listed in its {MANIFEST}")
    if not (math.isfinite(spec["ce_weight"]) and 0.0 <= spec["ce_weight"] <= 1.0):
        raise _fail(folder, f"ce_weight {spec['ce_weight']!r} is not a number in 0..1")
    if spec["layers"] < 1 or spec["max_seq_len"] < 16:
        raise _fail(folder, f"layers {spec['layers']} or max_seq_len {spec['max_seq_len']} is out of range")
    return dict(spec)


def _open(
    folder: Path, spec: dict[str, Any], model_id: str, threads: int, cpus: frozenset[int] | None
) -> OnnxCrossEncoder:
    from ragserve.rerank.cross_encoder import OnnxCrossEncoder

    try:
        check_model_file_size(folder / spec["onnx"])
        encoder = OnnxCrossEncoder.from_export(
            folder / spec["onnx"],
            folder / spec["dir"],
            model_id,
            threads=threads,
            cpus=cpus,
            max_seq_len=spec["max_seq_len"],
        )
        # One pair of the full stated length through the model now: a graph that does not run, or
        # takes fewer positions than the version says, is refused here, not per request.
        passage = " ".join(["passage"] * (spec["max_seq_len"] + 8))
        probe = encoder.score(encoder.encode("a question", [passage]))
    except Exception as exc:  # ONNX Runtime and tokenizer errors come in many types: one clear refusal
        raise _fail(folder, f"model {spec['onnx']} cannot be loaded: {exc}") from exc
    if probe.shape != (1,) or not math.isfinite(float(probe[0])):
        raise _fail(folder, f"model {spec['onnx']} does not give one finite score per pair")
    return encoder


def load_tuned_reranker(
    folder: Path, manifest: Manifest, threads: int, cpus: frozenset[int] | None = None
) -> TunedCrossEncoder | None:
    """The version's tuned cross-encoder (on `threads` ONNX Runtime threads, pinned to `cpus`), or
    None when it ships none. `manifest` must come from `read_verified_version` (so every listed
    file has passed its checksum)."""
    if not manifest.tuned_reranker:
        return None
    spec = _check_spec(folder, manifest)
    require_all_listed(folder, manifest, spec["dir"], "config.json")
    model_id = tuned_reranker_id(spec["base"], manifest.files[spec["onnx"]])
    encoder = _open(folder, spec, model_id, threads, cpus)
    if encoder.random_head:
        raise _fail(folder, f"{spec['dir']}/config.json marks a random-head test model: its scores are not relevance")
    layers = json.loads((folder / spec["dir"] / "config.json").read_text()).get("num_hidden_layers")
    if layers != spec["layers"]:
        raise _fail(folder, f"layers says {spec['layers']}, its config.json {layers!r}")
    return TunedCrossEncoder(encoder, float(spec["ce_weight"]), spec["beats_fused"], model_id, spec["max_seq_len"])
