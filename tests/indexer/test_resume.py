"""An interrupted build (Ctrl-C, SIGKILL) resumes from its checkpoints: it embeds only the rest and
publishes what a clean build publishes; checkpoints of other settings, or corrupt ones, are never
trusted."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from indexer.build import BuildReport, build_index
from indexer.checkpoint import CHECKPOINTS
from indexer.chunking import ChunkingConfig
from indexer.progress import EmbedProgress
from ragserve.index.chunk_store import read_chunks
from ragserve.index.format import CHUNKS_FILE, CURRENT, VECTORS_FILE, resolve_current
from tests.fakes import FakeEmbedder

REPO = Path(__file__).resolve().parents[2]
DOCS = 12
CHUNKING = ChunkingConfig(8, 0)  # 40 words a document: 5 chunks each
GROUP = 4  # chunks per group: one document a group, one checkpoint each


class WordTokenizer:
    """Words as tokens, with their character offsets (what chunking needs of a tokenizer)."""

    def __call__(self, texts: list[str], **_: Any) -> dict[str, list[list[tuple[int, int]]]]:
        return {"offset_mapping": [[(m.start(), m.end()) for m in re.finditer(r"\S+", text)] for text in texts]}


class SlowEmbedder(FakeEmbedder):
    """Deterministic vectors (the same text, the same vector, in any batch) that take a while;
    `stop_after` groups, then a KeyboardInterrupt, as Ctrl-C would."""

    def __init__(self, delay_s: float = 0.0, stop_after: int | None = None, model_id: str = "fake-embedder") -> None:
        super().__init__(dim=8)
        self.model_id = model_id
        self.tokenizer = WordTokenizer()
        self.delay_s = delay_s
        self.stop_after = stop_after
        self.texts: list[str] = []

    def embed_documents(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        if self.stop_after is not None and len(self.texts) >= self.stop_after * 5:
            raise KeyboardInterrupt
        time.sleep(self.delay_s)
        self.texts.extend(texts)
        return super().embed_documents(texts, batch_size)


def write_corpus(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for d in range(DOCS):
        (folder / f"doc{d:02d}.txt").write_text(" ".join(f"w{d}x{i}" for i in range(40)))
    return folder


def build(docs: Path, root: Path, embedder: SlowEmbedder, chunking: ChunkingConfig = CHUNKING) -> BuildReport:
    return build_index(docs, root, embedder, chunking, progress=False, incremental=False, group_chunks=GROUP)


def checkpoint_files(root: Path) -> list[Path]:
    return sorted((root / CHECKPOINTS).glob("*/*.group"))


def assert_same_index(root: Path, clean: Path) -> None:
    a, b = resolve_current(root), resolve_current(clean)
    assert read_chunks(a / CHUNKS_FILE) == read_chunks(b / CHUNKS_FILE)
    np.testing.assert_array_equal(np.load(a / VECTORS_FILE), np.load(b / VECTORS_FILE))


KILLED_BUILD = """
import sys
from pathlib import Path
from indexer.build import build_index
from tests.indexer.test_resume import CHUNKING, GROUP, SlowEmbedder
build_index(Path(sys.argv[1]), Path(sys.argv[2]), SlowEmbedder(delay_s=0.25), CHUNKING, progress=False,
            group_chunks=GROUP)
"""


@pytest.mark.slow  # a second or more of fault waits or child processes (CI runs it)
@pytest.mark.timeout(120)
def test_a_build_killed_with_sigkill_resumes_and_embeds_only_the_rest(tmp_path: Path) -> None:
    docs = write_corpus(tmp_path / "docs")
    root = tmp_path / "idx"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_BUILD, str(docs), str(root)], cwd=REPO, env=env)
    deadline = time.monotonic() + 60
    while len(checkpoint_files(root)) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the build ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert not (root / CURRENT).exists()  # nothing partial was published
    done = len(checkpoint_files(root))
    assert 3 <= done < DOCS

    spy = SlowEmbedder()
    report = build(docs, root, spy)
    assert report.published
    assert (report.resumed, report.embedded) == (done, DOCS - done)
    assert report.chunks_embedded == len(spy.texts) == 5 * (DOCS - done)
    assert not (root / CHECKPOINTS).exists()  # published: the checkpoints are done with

    clean = tmp_path / "clean"
    assert build(docs, clean, SlowEmbedder()).resumed == 0
    assert_same_index(root, clean)


def test_ctrl_c_keeps_finished_groups_and_a_corrupt_or_foreign_checkpoint_is_not_trusted(tmp_path: Path) -> None:
    docs = write_corpus(tmp_path / "docs")
    root = tmp_path / "idx"
    with pytest.raises(KeyboardInterrupt):
        build(docs, root, SlowEmbedder(stop_after=3))
    assert not (root / CURRENT).exists()
    files = checkpoint_files(root)
    assert len(files) == 3

    # Another embedder or other chunking: nothing of them is reused.
    _copy_checkpoints(root, tmp_path / "other-embedder")
    assert build(docs, tmp_path / "other-embedder", SlowEmbedder(model_id="another-embedder")).resumed == 0
    _copy_checkpoints(root, tmp_path / "other-chunking")
    assert build(docs, tmp_path / "other-chunking", SlowEmbedder(), ChunkingConfig(9, 0)).resumed == 0

    # One file corrupted (a flipped byte), one document edited since: both embedded again.
    victim = next(f for f in files if b'"doc01.txt"' not in f.read_bytes())
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    edited = (docs / "doc01.txt").read_text()
    (docs / "doc01.txt").write_text(edited.replace("w1x0", "changed"))
    spy = SlowEmbedder()
    report = build(docs, root, spy)
    assert (report.resumed, report.embedded) == (1, DOCS - 1)
    clean = tmp_path / "clean"
    build(docs, clean, SlowEmbedder())
    assert_same_index(root, clean)


def _copy_checkpoints(root: Path, target: Path) -> None:
    for path in checkpoint_files(root):
        dest = target / path.relative_to(root)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(path.read_bytes())


def test_without_a_terminal_progress_is_a_plain_line_with_rate_and_eta(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    shown = EmbedProgress(1_000_000, show=True, interval_s=0.0)
    shown.update(1_000, 2_300)
    line = capsys.readouterr().err
    assert re.search(r"embedded 1,000/1,000,000 documents \(2,300 chunks\) in .*chunks/s.*ETA \d+:\d\d:\d\d", line)
    assert "\r" not in line
    with caplog.at_level(logging.INFO, logger="indexer.progress"):
        quiet = EmbedProgress(10, show=False, interval_s=0.0)
        quiet.update(5, 9)
    assert not capsys.readouterr().err
    assert "embedded 5/10 documents (9 chunks)" in caplog.text
