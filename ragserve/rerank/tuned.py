"""A tuned cross-encoder shipped inside an index version.

Layout in a version folder (every file listed, with its sha256, in the manifest's `files`):

    reranker/model.int8.onnx    the tuned cross-encoder, ONNX int8 (the ONNX cross-encoder's export)
    reranker/config.json, tokenizer files

and in the manifest `tuned_reranker = {"dir": "reranker", "onnx": "reranker/model.int8.onnx",
"base": <model it was tuned from>, "layers": 2, "max_seq_len": 256, "ce_weight": 0.5,
"beats_fused": true}`: `ce_weight` is the fitted weight of the cross-encoder's score against the
fused score (rerank/blend.py), `beats_fused` whether that blend beat the fused order on held-back
queries. The model is reported as `tuned_reranker_id(base, sha256 of the ONNX file)`. The entry's
types and its files are checked where the version is read (`index/shipped.py`); here its values
are checked and the model opened and run once. Anything off (a value out of range, a random-head
test model, a model that does not run) raises IndexLoadError: the version is refused like a
corrupt index file.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

from ragserve.errors import IndexLoadError
from ragserve.pretrained import MAX_SEQ_POSITIONS
from ragserve.rerank.base import TunedCrossEncoder
from ragserve.types import ShippedModel

if TYPE_CHECKING:
    from ragserve.rerank.onnx_cross_encoder import OnnxCrossEncoder

TUNED_DIR = "reranker"
TUNED_ONNX = f"{TUNED_DIR}/model.int8.onnx"


def tuned_reranker_id(base: str, onnx_sha256: str) -> str:
    """How a version's tuned cross-encoder is reported: the base and the model's digest."""
    return f"{base}+reranker-{onnx_sha256[:16]}"


def _fail(model: ShippedModel, what: str) -> IndexLoadError:
    return IndexLoadError(f"index at {model.version_folder}: tuned_reranker: {what}")


def _check_values(model: ShippedModel) -> None:
    spec = model.spec
    if not (math.isfinite(spec["ce_weight"]) and 0.0 <= spec["ce_weight"] <= 1.0):
        raise _fail(model, f"ce_weight {spec['ce_weight']!r} is not a number in 0..1")
    if spec["layers"] < 1 or not 16 <= spec["max_seq_len"] <= MAX_SEQ_POSITIONS:
        raise _fail(model, f"layers {spec['layers']} or max_seq_len {spec['max_seq_len']} is out of range")


def _open(model: ShippedModel, model_id: str, threads: int, cpus: frozenset[int] | None) -> OnnxCrossEncoder:
    from ragserve.rerank.onnx_cross_encoder import OnnxCrossEncoder

    max_seq_len = model.spec["max_seq_len"]
    try:
        encoder = OnnxCrossEncoder.from_export(
            model.onnx, model.files, model_id, threads=threads, cpus=cpus, max_seq_len=max_seq_len
        )
        # One pair of the full stated length through the model now: a graph that does not run, or
        # takes fewer positions than the version says, is refused here, not per request.
        passage = " ".join(["passage"] * (max_seq_len + 8))
        probe = encoder.score(encoder.encode("a question", [passage]))
    except Exception as exc:  # ONNX Runtime and tokenizer errors come in many types: one clear refusal
        raise _fail(model, f"model {model.spec['onnx']} cannot be loaded: {exc}") from exc
    if probe.shape != (1,) or not math.isfinite(float(probe[0])):
        raise _fail(model, f"model {model.spec['onnx']} does not give one finite score per pair")
    return encoder


def open_tuned_reranker(model: ShippedModel, threads: int, cpus: frozenset[int] | None = None) -> TunedCrossEncoder:
    """The version's tuned cross-encoder, on `threads` ONNX Runtime threads pinned to `cpus`."""
    _check_values(model)
    model_id = tuned_reranker_id(model.base, model.sha256)
    encoder = _open(model, model_id, threads, cpus)
    if encoder.random_head:
        raise _fail(model, f"{model.spec['dir']}/config.json marks a random-head test model (scores are not relevance)")
    layers = json.loads((model.files / "config.json").read_text()).get("num_hidden_layers")
    if layers != model.spec["layers"]:
        raise _fail(model, f"layers says {model.spec['layers']}, its config.json {layers!r}")
    return TunedCrossEncoder(
        encoder, float(model.spec["ce_weight"]), model.spec["beats_fused"], model_id, model.spec["max_seq_len"]
    )
