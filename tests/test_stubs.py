"""The committed stubs must be exactly what the pinned generator makes from the .proto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_generated_stubs_match_the_proto(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(REPO / "protos" / "generate.py"), "--out", str(tmp_path)], check=True)
    fresh = sorted(p.relative_to(tmp_path) for p in (tmp_path / "ragserve").rglob("*_pb2*.py*"))
    committed = sorted(p.relative_to(REPO) for p in (REPO / "ragserve" / "v1").glob("*_pb2*.py*"))
    assert fresh == committed
    for relative in fresh:
        assert (tmp_path / relative).read_text() == (REPO / relative).read_text(), (
            f"{relative} drifted: run protos/generate.py"
        )
