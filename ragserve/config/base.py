"""The settings' shared helpers: the default models and home, and `default_of`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel

# The embedded default models; any HF id or local path can be configured instead.
DEFAULT_EMBEDDER = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_GENERATOR_NAME = "SmolLM2-135M-Instruct"
# The generator adapter the repository ships (a data folder, not code; NOTICE has its provenance).
DEFAULT_ADAPTER_NAME = "smollm2-squad2-grounded"
SHIPPED_ADAPTER = Path(__file__).resolve().parents[1] / "adapters" / DEFAULT_ADAPTER_NAME


def default_home() -> Path:
    """Where prepared models and the demo index live unless configured otherwise."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "ragserve" if xdg else Path.home() / ".cache" / "ragserve"


def default_generator_path() -> Path:
    """The embedded default as converted, without an adapter (the base every adapter is trained on)."""
    return default_home() / "models" / DEFAULT_GENERATOR_NAME


def merged_generator_path(base: Path, adapter: Path) -> Path:
    """Where set-up writes `base` with `adapter` merged in (a folder of its own: the base stays)."""
    return default_home() / "models" / f"{base.name}+{adapter.name}"


def default_of(section: type[BaseModel], name: str) -> Any:
    """The default this module gives `section.name`. A constructor taking a value that a setting owns
    uses it as its own default, so the two cannot disagree."""
    return section.model_fields[name].get_default(call_default_factory=True)
