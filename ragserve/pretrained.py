"""How every model file is opened with transformers / sentence-transformers."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_options(source: str | Path) -> dict[str, Any]:
    """Keyword arguments for each `from_pretrained`: never run code a model folder ships (and never
    stop to ask about it on a terminal), and a local folder never falls back to a hub download: a
    missing file fails at once. A hub id may still be fetched where the deployment allows it."""
    text = str(source)
    local = Path(text).is_absolute() or text.startswith((".", "~")) or Path(text).is_dir()
    return {"trust_remote_code": False, "local_files_only": local}


# The largest model file a version may ship: MiniLM-sized models are tens of MB; far past this is
# a crafted or wrong file, refused before ONNX Runtime maps it.
MAX_MODEL_FILE_BYTES = 1 << 30


# The most token positions a shipped MiniLM-sized model takes (BERT's 512): a stated sequence
# length past it is a crafted or wrong manifest, refused before anything is built from it.
MAX_SEQ_POSITIONS = 512


def check_model_file_size(path: Path) -> None:
    size = path.stat().st_size
    if size > MAX_MODEL_FILE_BYTES:
        raise ValueError(f"{path.name} is {size} bytes, more than the {MAX_MODEL_FILE_BYTES} a model file may be")
