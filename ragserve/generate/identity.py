"""What names a model's answers: its name and a digest of its files, for cache keys."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable
from pathlib import Path

from ragserve.reports import EngineChoice

# Files this small are hashed whole (config, tokenizer, generation settings); larger ones (weights)
# by name and size: reading gigabytes at start-up to name them is not worth it.
_HASH_WHOLE_BELOW = 4 << 20


@functools.cache
def model_digest(model: str) -> str:
    """A short digest of a local model folder's files; a hub id stands for itself."""
    folder = Path(model).expanduser()
    if not folder.is_dir():
        return "id"
    digest = hashlib.blake2b(digest_size=8)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        size = path.stat().st_size
        digest.update(f"{path.relative_to(folder)}\x00{size}\x00".encode())
        if size < _HASH_WHOLE_BELOW:
            digest.update(path.read_bytes())
    return digest.hexdigest()


def answer_identity(served: str, model: str, choices: Iterable[EngineChoice]) -> str:
    """The model that answers (`served`, with a digest of the local `model` folder) and the settings
    that change a greedy answer's text (dtype, speculation, the prompt's pad): the answer cache's key."""
    return f"{served}@{model_digest(model)}|{','.join(f'{c.name}={c.value}' for c in choices)}"
