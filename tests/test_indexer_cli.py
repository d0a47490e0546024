"""The indexer CLI on bad input: a clear message and a non-zero exit, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "indexer", *args], capture_output=True, text=True, timeout=300)


def test_missing_folder(tmp_path: Path) -> None:
    result = _run("build", str(tmp_path / "absent"), "--out", str(tmp_path / "idx"), "--no-progress")
    assert result.returncode == 2
    assert "does not exist" in result.stderr
    assert "Traceback" not in result.stderr


def test_empty_corpus(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "image.png").write_bytes(b"\x89PNG")
    result = _run("build", str(tmp_path / "docs"), "--out", str(tmp_path / "idx"), "--no-progress")
    assert result.returncode == 2
    assert "no indexable documents" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "idx" / "CURRENT").exists()


def test_bad_file_is_skipped_and_reported(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "good.txt").write_text("Good\nA readable document about tides and the moon.")
    (docs / "bad.txt").write_bytes(b"\xff\xfe\xfa not utf-8 \xff")
    result = _run("build", str(docs), "--out", str(tmp_path / "idx"), "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "skipped bad.txt" in result.stderr
    assert "1 documents" in result.stdout and "1 skipped" in result.stdout
