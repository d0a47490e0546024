"""A generator adapter (a peft LoRA folder with ragserve's manifest) and merging it into a model.

An adapter is trained against one exact set of base weights; merged into any other it would give
plausible-looking nonsense. So the manifest names the base by `weights_digest`, a hash of the
weights themselves (not of file names or sizes), and `merge_adapter` refuses a base that differs.
Set-up merges once (generate/model_prep.py); vLLM then serves a plain model folder at full speed.

Imports only torch, safetensors and peft (lazily): the training host needs nothing else.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragserve.errors import ConfigError

ADAPTER_MANIFEST = "ragserve-adapter.json"


@dataclass(frozen=True, slots=True)
class AdapterInfo:
    folder: Path
    name: str
    base_digest: str
    # A digest of the adapter's own files: the merged model's identity (answer cache, Info).
    digest: str


def weights_digest(state_dict: dict[str, Any]) -> str:
    """A hash over every tensor's name, shape and float32 bytes, in name order: the same weights
    give the same digest however they were loaded (GGUF, safetensors, another host)."""
    import torch

    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().to("cpu", torch.float32).contiguous()
        digest.update(f"{name}\x00{tuple(tensor.shape)}\x00".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


# What the merge reads; a README beside them can change without a new merge.
_ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin", ADAPTER_MANIFEST)


def files_digest(folder: Path) -> str:
    digest = hashlib.blake2b(digest_size=8)
    for path in sorted(folder / name for name in _ADAPTER_FILES if (folder / name).is_file()):
        digest.update(f"{path.relative_to(folder)}\x00".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def read_adapter(folder: Path) -> AdapterInfo:
    """The adapter's manifest; a folder that is not an adapter is a configuration error."""
    manifest = folder / ADAPTER_MANIFEST
    if not (folder / "adapter_config.json").is_file() or not manifest.is_file():
        raise ConfigError(
            f"{folder} is not a generator adapter (it needs adapter_config.json and {ADAPTER_MANIFEST}); "
            "set RAGSERVE_GENERATOR_ADAPTER to an adapter folder, or none for the base model"
        )
    data = json.loads(manifest.read_text())
    return AdapterInfo(folder, str(data.get("name", folder.name)), str(data["base_digest"]), files_digest(folder))


def merge_adapter(model: Any, adapter: AdapterInfo) -> Any:
    """`model` with the adapter's weights merged in (a plain model again). Refused, with a clear
    error, when the model's weights are not the ones the adapter was trained on."""
    from peft import PeftModel

    found = weights_digest(model.state_dict())
    if found != adapter.base_digest:
        raise ConfigError(
            f"adapter {adapter.name} ({adapter.folder}) was trained on base weights {adapter.base_digest}, "
            f"but this model's weights are {found}: train an adapter for this model, or set "
            "RAGSERVE_GENERATOR_ADAPTER=none"
        )
    return PeftModel.from_pretrained(model, str(adapter.folder)).merge_and_unload()
