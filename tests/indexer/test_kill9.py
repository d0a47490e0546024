"""SIGKILL the indexer at many points of a build: the published CURRENT always loads and verifies."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ragserve.index.format import CURRENT, read_verified_manifest, resolve_current
from ragserve.index.hnsw import HnswIndex
from tests.index.conftest import write_docs


def _indexer(docs: Path, root: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "indexer", "build", str(docs), "--out", str(root), "--full", "--no-progress"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _kill_when_writing(proc: subprocess.Popen[bytes], root: Path, delay_s: float) -> None:
    """Wait until the build folder appears (index files being written), then SIGKILL after `delay_s`."""
    while proc.poll() is None and not list(root.glob(".build-*")):
        time.sleep(0.001)
    time.sleep(delay_s)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


@pytest.mark.slow  # about a minute: SIGKILLs the indexer at many points
@pytest.mark.timeout(1800)
def test_kill9_never_leaves_a_half_published_index(tmp_path: Path) -> None:
    docs = write_docs(tmp_path / "docs")
    root = tmp_path / "idx"
    assert _indexer(docs, root).wait(timeout=600) == 0
    first = read_verified_manifest(resolve_current(root))

    rng = random.Random(20261122)
    # One kill while loading/embedding, then kills spread over the write -> fsync -> rename ->
    # symlink flip window, with a random component so repeated runs probe different instants.
    delays = [None, 0.0, 0.1, 0.4]
    versions = {first.version}
    for delay in delays:
        proc = _indexer(docs, root)
        if delay is None:
            time.sleep(3.0)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        else:
            _kill_when_writing(proc, root, delay + rng.uniform(0.0, 0.02))
        assert (root / CURRENT).is_symlink()
        index = HnswIndex.load(root)  # verifies every checksum and count
        assert index.count == first.count and index.lexical_available
        assert resolve_current(root).name == f"v{index.manifest.version:06d}"
        versions.add(index.manifest.version)

    # After all that, a clean build publishes the next version and clears the killed builds' leftovers.
    assert _indexer(docs, root).wait(timeout=600) == 0
    final = HnswIndex.load(root)
    assert final.manifest.version > max(versions) - 1
    assert not list(root.glob(".build-*"))
