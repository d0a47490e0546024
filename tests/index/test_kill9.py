"""SIGKILL the indexer at many points of a build: the published CURRENT always loads and verifies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ragserve.index.format import CURRENT, read_verified_manifest, resolve_current
from ragserve.index.hnsw import HnswIndex
from tests.conftest import SAMPLE_DOCS


def _indexer(root: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "indexer", "build", str(SAMPLE_DOCS), "--out", str(root), "--full", "--no-progress"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_kill9_never_leaves_a_half_published_index(tmp_path: Path) -> None:
    root = tmp_path / "idx"
    started = time.monotonic()
    assert _indexer(root).wait(timeout=600) == 0
    full_run_s = time.monotonic() - started
    first = read_verified_manifest(resolve_current(root))

    # Kill at spread-out fractions of a full run: start-up, chunking/embedding, HNSW/BM25 writes,
    # fsync and the rename/symlink flip near the end.
    published = {first.version}
    for fraction in (0.15, 0.4, 0.6, 0.75, 0.85, 0.92, 0.97, 1.02):
        proc = _indexer(root)
        time.sleep(full_run_s * fraction)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        assert (root / CURRENT).is_symlink()
        index = HnswIndex.load(root)  # verifies every checksum and count
        assert index.count == first.count
        assert index.lexical_available
        published.add(index.manifest.version)
        assert resolve_current(root).name == f"v{index.manifest.version:06d}"

    # A clean build after all that still publishes a new, higher version.
    assert _indexer(root).wait(timeout=600) == 0
    final = HnswIndex.load(root)
    assert final.manifest.version > max(published) - 1
    assert not list(root.glob(".build-*"))
