"""Hostile document trees: links out of the tree, oversized files, PDF bombs, slow parses,
non-UTF-8 file names and two indexers on one root. Each is skipped with a reason or refused
clearly; none reads outside the tree, stalls the build or loses it."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pytest

from indexer.loaders import Document, Skipped
from indexer.sources import iter_source
from tests.helpers import pdf_file

if TYPE_CHECKING:
    from indexer.formats import LoadLimits

# A slow parse is cut at this; the bound asserted below is generous for a loaded 2-core host
# (spawning the parse worker takes a second or two there) and far below the reader's sleep.
PARSE_TIMEOUT_S = 0.5
SLOW_READER_SLEEP_S = 60.0


def _items(folder: Path) -> dict[str, Document | Skipped]:
    return {(i.doc_id if isinstance(i, Document) else i.source): i for i in iter_source(folder)}


def _run_indexer(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "indexer", *args], capture_output=True, text=True, timeout=300)


def bomb_pdf(pages: int, chars_per_page: int) -> bytes:
    """A few KB of PDF whose pages all share one compressed content stream of `chars_per_page` letters."""
    line = b"(" + b"A" * 1000 + b") Tj "
    stream = zlib.compress(b"BT /F1 12 Tf 72 720 Td " + line * (chars_per_page // 1000) + b"ET", 9)
    kids = " ".join(f"{6 + i} 0 R" for i in range(pages)).encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [" + kids + b"] /Count " + str(pages).encode() + b" >>",
        b"<< >>",
        b"<< /Length " + str(len(stream)).encode() + b" /Filter /FlateDecode >>\nstream\n" + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    objects += [
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>"
    ] * pages
    return pdf_file(objects, "")


def slow_reader(data: bytes, limits: LoadLimits) -> tuple[str, str]:
    """A fake reader that never finishes in time (module level: the parse worker imports it)."""
    time.sleep(SLOW_READER_SLEEP_S)
    return "", data.decode()


def test_links_out_of_the_tree_are_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("Secret\nThe root password is hunter2.")
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "a.txt").write_text("Tides\nThe moon pulls the oceans.")
    (tree / "link.txt").symlink_to(outside / "secret.txt")
    (tree / "relative.md").symlink_to(Path("..") / "outside" / "secret.txt")
    (tree / "linkdir").symlink_to(outside, target_is_directory=True)
    (tree / "inner.txt").symlink_to(Path("sub") / "a.txt")
    items = _items(tree)
    for name in ("link.txt", "relative.md"):
        skipped = items[name]
        assert isinstance(skipped, Skipped) and not skipped.ignored, name
        assert "outside the source folder" in skipped.reason
    inner = items["inner.txt"]
    assert isinstance(inner, Skipped) and inner.ignored  # its target is indexed as sub/a.txt
    assert isinstance(items["sub/a.txt"], Document)
    documents = [i for i in items.values() if isinstance(i, Document)]
    assert [d.doc_id for d in documents] == ["sub/a.txt"]
    assert not any("hunter2" in d.text for d in documents)


def test_a_file_over_the_size_cap_is_skipped_unread(tmp_path: Path) -> None:
    (tmp_path / "ok.txt").write_text("Fine\nA normal document.")
    with (tmp_path / "huge.txt").open("wb") as handle:
        handle.write(b"Huge\n")
        handle.truncate(21 * 1024 * 1024)  # sparse: over the 20 MB default without writing it
    items = _items(tmp_path)
    huge = items["huge.txt"]
    assert isinstance(huge, Skipped) and not huge.ignored
    assert "over the limit of 20,971,520 bytes" in huge.reason
    assert isinstance(items["ok.txt"], Document)


@pytest.mark.slow  # parses a PDF bomb up to the text cap
def test_a_pdf_bomb_is_cut_at_the_text_cap(tmp_path: Path) -> None:
    data = bomb_pdf(pages=6, chars_per_page=1_000_000)  # 6 M characters from a few KB
    assert len(data) < 20_000
    (tmp_path / "bomb.pdf").write_bytes(data)
    bomb = _items(tmp_path)["bomb.pdf"]
    assert isinstance(bomb, Skipped) and not bomb.ignored
    assert "extracted text is over the limit of 5,000,000 characters" in bomb.reason


@pytest.mark.slow  # a second or more of fault waits or child processes (CI runs it)
def test_a_parse_that_overruns_is_killed_and_the_next_file_still_parses(tmp_path: Path) -> None:
    from indexer.formats import LoadLimits
    from indexer.loaders import iter_folder_files
    from tests.indexer.test_loaders import tiny_pdf

    (tmp_path / "slow.html").write_text("<p>never parsed in time</p>")
    (tmp_path / "fine.pdf").write_bytes(tiny_pdf("Glaciers carve valleys."))
    limits = LoadLimits(parse_timeout_s=PARSE_TIMEOUT_S)
    paths = [tmp_path / "slow.html", tmp_path / "fine.pdf"]
    started = time.monotonic()
    items = list(iter_folder_files(tmp_path, paths, limits, readers={".html": slow_reader}))
    elapsed = time.monotonic() - started
    assert isinstance(items[0], Skipped) and "parsing took longer than the limit of 0.5 s" in items[0].reason
    assert isinstance(items[1], Document) and "Glaciers carve valleys" in items[1].text
    assert elapsed < SLOW_READER_SLEEP_S / 3  # the worker was killed, not waited for


@pytest.mark.slow  # a child process parses up to its memory cap
def test_a_parse_that_needs_too_much_memory_is_stopped_and_the_next_file_still_parses(tmp_path: Path) -> None:
    from indexer.formats import LoadLimits
    from indexer.loaders import iter_folder_files
    from tests.indexer.test_loaders import tiny_pdf

    # 1 MB of tiny tags: html.parser's tree would take some 135 MB, past a 128 MB worker.
    (tmp_path / "tags.html").write_bytes(b"<html><body>" + b"<i>a</i>" * 125_000 + b"</body></html>")
    (tmp_path / "fine.pdf").write_bytes(tiny_pdf("Glaciers carve valleys."))
    limits = LoadLimits(parse_memory_mb=128)
    items = list(iter_folder_files(tmp_path, [tmp_path / "tags.html", tmp_path / "fine.pdf"], limits))
    assert isinstance(items[0], Skipped) and "parsing needed more than the limit of 128 MB" in items[0].reason
    assert isinstance(items[1], Document) and "Glaciers carve valleys" in items[1].text
    # The same file parses within the default cap.
    (tagged,) = iter_folder_files(tmp_path, [tmp_path / "tags.html"], LoadLimits())
    assert isinstance(tagged, Document) and tagged.text.startswith("a")


def unsendable_reader(data: bytes, limits: object) -> tuple[object, str]:
    """A reader whose result cannot be pickled back from the parse worker (module level: the
    spawned worker imports it by name)."""
    return (lambda: "title"), "text"


def test_a_result_that_cannot_be_sent_back_skips_the_file_and_replaces_the_worker(tmp_path: Path) -> None:
    from indexer.formats import FileRejected, LoadLimits
    from indexer.parse_worker import IsolatedParser

    parser = IsolatedParser()
    try:
        with pytest.raises(FileRejected, match="could not be sent back"):
            parser.parse(unsendable_reader, b"<p>x</p>", LoadLimits())  # type: ignore[arg-type]
        assert parser._pool is None  # the worker that failed is gone; the next file gets a new one
    finally:
        parser.close()


@pytest.mark.slow  # runs the indexer CLI in a child process (loads MiniLM)
def test_non_utf8_file_name_is_indexed_and_served(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "tides.txt").write_text("Tides\nOcean tides are caused by the moon.")
    with open(os.path.join(os.fsencode(docs), b"caf\xe9.txt"), "wb") as handle:
        handle.write(b"Coffee\nEspresso is brewed by forcing hot water through ground coffee.")
    out = tmp_path / "idx"
    result = _run_indexer("build", str(docs), "--out", str(out), "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "2 documents" in result.stdout
    records = [orjson.loads(line) for line in (out / "CURRENT" / "documents.jsonl").read_bytes().splitlines()]
    assert sorted(r["doc_id"] for r in records) == ["caf\\xe9.txt", "tides.txt"]
    from ragserve.index.hnsw import HnswIndex

    index = HnswIndex.load(out)
    assert "caf\\xe9.txt" in {hit.chunk.doc_id for hit in index.search_lexical("espresso coffee", 2)}


def test_a_second_indexer_on_the_same_root_fails_fast(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("A\nsome text about tides")
    out = tmp_path / "idx"
    out.mkdir()
    # Another indexer's hold on the root, as the indexer itself takes it.
    holder = os.open(out / ".indexer.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        result = _run_indexer("build", str(docs), "--out", str(out), "--no-progress")
    finally:
        os.close(holder)
    assert result.returncode == 2, result.stdout
    assert "another indexer is building into" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (out / "CURRENT").exists()


def test_the_root_lock_is_released_and_reentrant(tmp_path: Path) -> None:
    from indexer.root_lock import index_root_lock

    root = tmp_path / "idx"
    with index_root_lock(root), index_root_lock(root):  # the CLI holds it around build_index
        probe = os.open(root / ".indexer.lock", os.O_RDWR)
        try:
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
                raise AssertionError("the lock was not held")
            except BlockingIOError:
                pass
        finally:
            os.close(probe)
    with index_root_lock(root):
        pass  # released: taken again at once
