"""A tuned query embedder shipped inside an index version, loaded and checked like its index files.

Layout in a version folder (every file listed, with its sha256, in the manifest's `files`):

    embedder/model.int8.onnx    the tuned bi-encoder, ONNX int8 (the ONNX backend's export)
    embedder/config.json, tokenizer files, sentence_bert_config.json

and in the manifest `tuned_embedder = {"dir": "embedder", "onnx": "embedder/model.int8.onnx",
"base": <model it was tuned from>, "max_seq_length": 256}`; `embedder_id` is
`tuned_model_id(base, sha256 of the ONNX file)`, so a version's vectors name the exact model
that made them. Anything off (a missing or unlisted file, a checksum, an id that does not match
the file, a model of another dimension) raises IndexLoadError: the version is refused exactly
like a corrupt index file, at start-up or on hot reload.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ragserve.errors import IndexLoadError
from ragserve.index.format import MANIFEST, Manifest, check_file_name, require_all_listed
from ragserve.pretrained import check_model_file_size

if TYPE_CHECKING:
    from ragserve.embed.onnx_backend import OnnxEmbedder

TUNED_DIR = "embedder"
TUNED_ONNX = f"{TUNED_DIR}/model.int8.onnx"
_SPEC_KEYS = {"dir": str, "onnx": str, "base": str, "max_seq_length": int}


def tuned_model_id(base: str, onnx_sha256: str) -> str:
    """The embedder id of a version re-embedded with a tuned model: the base and the model's digest."""
    return f"{base}+tuned-{onnx_sha256[:16]}"


def _check_spec(folder: Path, manifest: Manifest) -> dict[str, str]:
    spec = manifest.tuned_embedder
    for key, kind in _SPEC_KEYS.items():
        if not isinstance(spec.get(key), kind):
            raise IndexLoadError(f"index at {folder}: tuned_embedder.{key} is missing or not a {kind.__name__}")
    try:
        check_file_name(spec["dir"])
        check_file_name(spec["onnx"])
    except ValueError as exc:
        raise IndexLoadError(f"index at {folder}: tuned_embedder: {exc}") from None
    if not spec["onnx"].startswith(spec["dir"] + "/") or spec["onnx"] not in manifest.files:
        raise IndexLoadError(f"index at {folder}: tuned model {spec['onnx']} is not listed in its {MANIFEST}")
    return {"dir": spec["dir"], "onnx": spec["onnx"], "base": spec["base"]}


def load_tuned_embedder(folder: Path, manifest: Manifest, threads: int) -> OnnxEmbedder | None:
    """The version's own query embedder, or None when it ships none. `manifest` must come from
    `read_verified_version` (so every listed file has passed its checksum)."""
    if not manifest.tuned_embedder:
        return None
    from ragserve.embed.onnx_backend import OnnxEmbedder

    spec = _check_spec(folder, manifest)
    require_all_listed(folder, manifest, spec["dir"], "config.json")
    expected_id = tuned_model_id(spec["base"], manifest.files[spec["onnx"]])
    if manifest.embedder_id != expected_id:
        raise IndexLoadError(
            f"index at {folder}: embedder_id {manifest.embedder_id!r} does not name its tuned model "
            f"({expected_id!r}): the model and the vectors do not belong together"
        )
    try:
        check_model_file_size(folder / spec["onnx"])
        embedder = OnnxEmbedder.from_export(
            folder / spec["onnx"], folder / spec["dir"], expected_id, threads=threads, spin=False
        )
        width = embedder.output_width()
    except Exception as exc:  # ONNX Runtime and tokenizer errors come in many types: one clear refusal
        raise IndexLoadError(f"index at {folder}: tuned model {spec['onnx']} cannot be loaded: {exc}") from exc
    if embedder.dim != manifest.dim or width != manifest.dim:
        raise IndexLoadError(
            f"index at {folder}: tuned model makes {width}-dim vectors (config {embedder.dim}), "
            f"the index holds {manifest.dim}-dim vectors"
        )
    return embedder


def fitted_weight(folder: Path, manifest: Manifest) -> float | None:
    """The dense fusion weight `indexer tune` fitted for this version, if any (checked: 0..1)."""
    weight = manifest.tuning.get("fusion_dense_weight")
    if weight is None:
        return None
    if not isinstance(weight, int | float) or isinstance(weight, bool) or not 0.0 <= weight <= 1.0:
        raise IndexLoadError(f"index at {folder}: tuning.fusion_dense_weight {weight!r} is not a number in 0..1")
    return float(weight)
