from __future__ import annotations

from pathlib import Path
from typing import Any

from ragserve.config import (
    AnswerSettings,
    CacheSettings,
    IndexSettings,
    ObservabilitySettings,
    RequestSettings,
    Settings,
    TransportSettings,
)
from tests.helpers import free_port

SMALL_DOCS = {
    "alpha.txt": "Alpha particles\nAn alpha particle is a helium-4 nucleus: two protons and two neutrons.",
    "beta.md": "# Beta decay\nBeta decay emits an electron or a positron and a neutrino from a nucleus.",
    "gamma.txt": "Gamma rays\nGamma rays are high-energy photons released when an excited nucleus relaxes.",
    "tides.txt": "Tides\nOcean tides are caused mainly by the gravitational pull of the moon on the oceans.",
    "sourdough.md": "# Sourdough\nSourdough bread rises through wild yeast and lactic acid bacteria in a starter.",
}


def write_docs(folder: Path, docs: dict[str, str] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (docs or SMALL_DOCS).items():
        (folder / name).write_text(text)
    return folder


def reloading_settings(root: Path, **index: Any) -> Settings:
    """A retrieval-only server on a free port that checks `root` for new versions every 0.1 s."""
    return Settings(
        index=IndexSettings(path=root, reload_interval_s=0.1, **index),
        transport=TransportSettings(port=free_port()),
        answer=AnswerSettings(generation_enabled=False),
        observability=ObservabilitySettings(metrics_port=0),
        cache=CacheSettings(backend="off"),
        requests=RequestSettings(retrieval_budget_ms=10_000),
    )
