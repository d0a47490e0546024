from __future__ import annotations

from pathlib import Path

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
