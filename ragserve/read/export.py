"""Which reader folder a setting names: the one this project ships, a reader folder as written by
`ragserve-index tune-reader`, or a question-answering model exported to one once."""

from __future__ import annotations

from pathlib import Path

from ragserve.errors import ConfigError
from ragserve.read.folder import DEFAULT_READER_DIR, MANIFEST


def reader_folder(model: str, cache_dir: Path) -> Path:
    """`model` empty: the shipped reader; a folder holding a reader manifest: that folder."""
    if not model:
        return DEFAULT_READER_DIR
    folder = Path(model).expanduser()
    if (folder / MANIFEST).is_file():
        return folder
    raise ConfigError(f"RAGSERVE_READER_MODEL={model}: not a reader folder (no {MANIFEST})")
