"""The indexer CLI on bad input: a clear message and a non-zero exit, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "indexer", *args], capture_output=True, text=True, timeout=300)


def test_missing_folder(tmp_path: Path) -> None:
    result = _run("build", str(tmp_path / "absent"), "--out", str(tmp_path / "idx"), "--no-progress")
    assert result.returncode == 2
    assert "does not exist" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # runs the indexer CLI in a child process (loads MiniLM)
def test_empty_corpus(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "image.png").write_bytes(b"\x89PNG")
    result = _run("build", str(tmp_path / "docs"), "--out", str(tmp_path / "idx"), "--no-progress")
    assert result.returncode == 2
    assert "no indexable documents" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "idx" / "CURRENT").exists()


@pytest.mark.slow  # runs the indexer CLI in a child process (loads MiniLM)
def test_bad_file_is_skipped_and_reported(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "good.txt").write_text("Good\nA readable document about tides and the moon.")
    (docs / "bad.txt").write_bytes(b"\xff\xfe\xfa not utf-8 \xff")
    result = _run("build", str(docs), "--out", str(tmp_path / "idx"), "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "skipped bad.txt" in result.stderr and "--encoding" in result.stderr  # the fix, named
    assert "1 documents" in result.stdout and "1 skipped" in result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # runs the indexer CLI in a child process (loads MiniLM)
def test_windows_text_with_its_encoding_and_an_embedder_switch_warned_about(tmp_path: Path) -> None:
    from tests.index.tuned_fake import save_fake_tuned_model

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "cafe.txt").write_bytes("Caf\xe9 r\xe9sum\xe9: na\xefve \u2013 \u201cquoted\u201d".encode("cp1252"))
    result = _run("build", str(docs), "--out", str(tmp_path / "idx"), "--no-progress", "--encoding", "cp1252")
    assert result.returncode == 0 and "1 documents" in result.stdout, result.stderr
    assert "warning" not in result.stderr
    other = save_fake_tuned_model(tmp_path / "other-embedder")
    args = ["build", str(docs), "--out", str(tmp_path / "idx"), "--no-progress", "--encoding", "cp1252"]
    switched = _run(*args, "--full", "--embedder", str(other))
    assert switched.returncode == 0, switched.stderr
    assert "warning: the published version was built with embedder" in switched.stderr
    assert "RAGSERVE_EMBEDDER_MODEL" in switched.stderr


@pytest.mark.slow  # runs the indexer CLI in a child process (loads MiniLM)
def test_mixed_tree_with_bad_pdf_html_and_unsupported_files(tmp_path: Path) -> None:
    from tests.indexer.test_loaders import tiny_pdf

    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "a.md").write_text("# Volcanoes\nMagma reaches the surface through vents.")
    (docs / "sub" / "b.html").write_text(
        "<html><head><title>Glaciers</title></head><body><p>Ice flows.</p></body></html>"
    )
    (docs / "sub" / "c.pdf").write_bytes(tiny_pdf("Deserts get little rain."))
    (docs / "broken.pdf").write_bytes(b"%PDF-1.7 truncated")
    (docs / "photo.jpg").write_bytes(b"\xff\xd8\xff")
    result = _run("build", str(docs), "--out", str(tmp_path / "idx"), "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "skipped broken.pdf: cannot extract text" in result.stderr
    assert "photo.jpg" not in result.stderr  # not a document: counted, not warned about
    assert "3 documents" in result.stdout and "1 skipped" in result.stdout and "1 ignored" in result.stdout
    assert "photo.jpg (unsupported file type '.jpg')" in result.stdout  # named where it is counted
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # runs the indexer CLI in a child process (loads MiniLM)
def test_unsupported_source_type(tmp_path: Path) -> None:
    (tmp_path / "report.docx").write_bytes(b"PK\x03\x04")
    result = _run("build", str(tmp_path / "report.docx"), "--out", str(tmp_path / "idx"), "--no-progress")
    assert result.returncode == 2
    assert "unsupported source" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # runs the indexer CLI in a child process (loads MiniLM)
def test_empty_corpus_jsonl(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('\n{"_id": "1", "title": "", "text": "  "}\n')
    result = _run("build", str(corpus), "--out", str(tmp_path / "idx"), "--no-progress")
    assert result.returncode == 2
    assert "no indexable documents" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # a second or more of fault waits or child processes (CI runs it)
def test_bad_options(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("A\nsome text")
    for args, message in (
        (["--chunk-tokens", "32", "--overlap-tokens", "32"], "overlap"),
        (["--backend", "tensorrt"], "--backend must be torch or onnx"),
    ):
        result = _run("build", str(tmp_path / "docs"), "--out", str(tmp_path / "idx"), "--no-progress", *args)
        assert result.returncode == 2, args
        assert message in result.stderr
        assert "Traceback" not in result.stderr


def test_unreadable_output_root(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("A\nsome text")
    (tmp_path / "blocker").write_text("a file where the index root should be")
    result = _run("build", str(tmp_path / "docs"), "--out", str(tmp_path / "blocker" / "idx"), "--no-progress")
    assert result.returncode == 2
    assert "error: " in result.stderr and "Not a directory" in result.stderr
    assert "Traceback" not in result.stderr
