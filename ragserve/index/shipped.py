"""The models an index version ships (a tuned query embedder, a tuned cross-encoder) and its fitted
fusion weight, read from its manifest in one place.

A manifest entry names a folder and an ONNX file inside it (`{"dir": "embedder", "onnx":
"embedder/model.int8.onnx", "base": ..., ...}`). Here the entry's keys are type-checked, its file
names checked to stay inside the version folder, every file of its folder checked to be listed (so
verified by its checksum) and the model's size capped; `embed/tuned.py` and `rerank/tuned.py` get
plain paths (`types.ShippedModel`) and open the model. Anything off raises IndexLoadError: the
version is refused exactly like a corrupt index file, at start-up or on hot reload.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ragserve.errors import IndexLoadError
from ragserve.index.format import MANIFEST, Manifest, check_file_name, require_all_listed
from ragserve.pretrained import MAX_SEQ_POSITIONS, check_model_file_size
from ragserve.types import ShippedModel

EMBEDDER_ENTRY = "tuned_embedder"
RERANKER_ENTRY = "tuned_reranker"
# Every entry's keys and their types; bool is an int to isinstance, so only a bool key may be one.
_COMMON_KEYS: dict[str, type | tuple[type, ...]] = {"dir": str, "onnx": str, "base": str}
ENTRY_KEYS: dict[str, dict[str, type | tuple[type, ...]]] = {
    EMBEDDER_ENTRY: {**_COMMON_KEYS, "max_seq_length": int},
    RERANKER_ENTRY: {
        **_COMMON_KEYS,
        "layers": int,
        "max_seq_len": int,
        "ce_weight": (int, float),
        "beats_fused": bool,
    },
}
# Whole-number keys that size what the loader builds, and their ranges (checked when the version is read).
_RANGES: dict[tuple[str, str], tuple[int, int]] = {
    (EMBEDDER_ENTRY, "max_seq_length"): (1, MAX_SEQ_POSITIONS),
    (RERANKER_ENTRY, "max_seq_len"): (16, MAX_SEQ_POSITIONS),
}


def shipped_model(folder: Path, manifest: Manifest, entry: str) -> ShippedModel | None:
    """The model of manifest entry `entry`, its files checked, or None when the version ships none.
    `manifest` must come from `read_verified_version` (every listed file has passed its checksum)."""
    spec: dict[str, Any] = getattr(manifest, entry)
    if not spec:
        return None
    for key, kind in ENTRY_KEYS[entry].items():
        value = spec.get(key)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise IndexLoadError(f"index at {folder}: {entry}.{key} is missing or of the wrong type ({value!r})")
        bounds = _RANGES.get((entry, key))
        if bounds is not None and isinstance(value, int) and not bounds[0] <= value <= bounds[1]:
            low, high = bounds
            raise IndexLoadError(f"index at {folder}: {entry}.{key} {value!r} is not a whole number in {low}..{high}")
    try:
        check_file_name(spec["dir"])
        check_file_name(spec["onnx"])
    except ValueError as exc:
        raise IndexLoadError(f"index at {folder}: {entry}: {exc}") from None
    if not spec["onnx"].startswith(spec["dir"] + "/") or spec["onnx"] not in manifest.files:
        raise IndexLoadError(f"index at {folder}: {entry}: model {spec['onnx']} is not listed in its {MANIFEST}")
    require_all_listed(folder, manifest, spec["dir"], "config.json")
    try:
        check_model_file_size(folder / spec["onnx"])
    except Exception as exc:
        raise IndexLoadError(f"index at {folder}: {entry}: model {spec['onnx']} cannot be loaded: {exc}") from exc
    return ShippedModel(
        folder, folder / spec["onnx"], folder / spec["dir"], spec["base"], manifest.files[spec["onnx"]], dict(spec)
    )


def fitted_weight(folder: Path, manifest: Manifest) -> float | None:
    """The dense fusion weight `ragserve-index tune` fitted for this version, if any (checked: 0..1)."""
    weight = manifest.tuning.get("fusion_dense_weight")
    if weight is None:
        return None
    if not isinstance(weight, int | float) or isinstance(weight, bool) or not 0.0 <= weight <= 1.0:
        raise IndexLoadError(f"index at {folder}: tuning.fusion_dense_weight {weight!r} is not a number in 0..1")
    if not math.isfinite(weight):
        raise IndexLoadError(f"index at {folder}: tuning.fusion_dense_weight {weight!r} is not finite")
    return float(weight)
