"""A tuned query embedder shipped inside an index version.

Layout in a version folder (every file listed, with its sha256, in the manifest's `files`):

    embedder/model.int8.onnx    the tuned bi-encoder, ONNX int8 (the ONNX backend's export)
    embedder/config.json, tokenizer files, sentence_bert_config.json

and in the manifest `tuned_embedder = {"dir": "embedder", "onnx": "embedder/model.int8.onnx",
"base": <model it was tuned from>, "max_seq_length": 256}`; `embedder_id` is
`tuned_model_id(base, sha256 of the ONNX file)`, so a version's vectors name the exact model
that made them. The entry and its files are checked where the version is read
(`index/shipped.py`); here the model is opened and checked against the vectors. Anything off
raises IndexLoadError: the version is refused like a corrupt index file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragserve.errors import IndexLoadError
from ragserve.types import ShippedModel

if TYPE_CHECKING:
    from ragserve.embed.onnx_backend import OnnxEmbedder

TUNED_DIR = "embedder"
TUNED_ONNX = f"{TUNED_DIR}/model.int8.onnx"


def tuned_model_id(base: str, onnx_sha256: str) -> str:
    """The embedder id of a version re-embedded with a tuned model: the base and the model's digest."""
    return f"{base}+tuned-{onnx_sha256[:16]}"


def open_tuned_embedder(model: ShippedModel, embedder_id: str, dim: int, threads: int) -> OnnxEmbedder:
    """The version's own query embedder; `embedder_id` and `dim` are what its vectors say they are."""
    from ragserve.embed.onnx_backend import OnnxEmbedder

    where = f"index at {model.version_folder}"
    expected_id = tuned_model_id(model.base, model.sha256)
    if embedder_id != expected_id:
        raise IndexLoadError(
            f"{where}: embedder_id {embedder_id!r} does not name its tuned model "
            f"({expected_id!r}): the model and the vectors do not belong together"
        )
    try:
        embedder = OnnxEmbedder.from_export(model.onnx, model.files, expected_id, threads=threads, spin=False)
        width = embedder.output_width()
    except Exception as exc:  # ONNX Runtime and tokenizer errors come in many types: one clear refusal
        raise IndexLoadError(f"{where}: tuned model {model.spec['onnx']} cannot be loaded: {exc}") from exc
    if embedder.dim != dim or width != dim:
        raise IndexLoadError(
            f"{where}: tuned model makes {width}-dim vectors (config {embedder.dim}), the index holds {dim}-dim vectors"
        )
    return embedder
