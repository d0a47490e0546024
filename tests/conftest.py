from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Generator
from pathlib import Path

import pytest

from indexer.build import build_index
from ragserve.embed.torch_backend import SentenceTransformerEmbedder

# The indexer's CLI lowers its own priority and caps its threads (indexer/host_share.py): tests
# that run it in this process must not renice the test run (and every server it starts after).
# tests/indexer/test_host_share.py checks that behaviour in processes of its own.
os.environ.setdefault("RAGSERVE_INDEXER_NICE", "0")
os.environ.setdefault("RAGSERVE_INDEXER_THREADS", str(len(os.sched_getaffinity(0))))

REPO = Path(__file__).resolve().parent.parent
SAMPLE_DOCS = REPO / "indexer" / "sample_docs"
E2E_TESTS = Path(__file__).resolve().parent / "e2e"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Everything under tests/e2e starts a real server process: marked `e2e`, so the default
    `pytest` run (see addopts in pyproject.toml) leaves it to `deploy/local/test.sh`."""
    for item in items:
        if E2E_TESTS in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    """Where pytest processes run side by side (deploy/local/test.sh's lanes, or pytest-xdist's
    workers), a test marked `alone` runs while no other process runs a test (its set-up and
    tear-down included): it waits for the tests running beside it to end, and holds the next ones
    back. Its fixtures stay shared."""
    folder = _locks_folder(item.config)
    if folder is None:
        return (yield)
    with (folder / "alone.turnstile").open("a") as turnstile, (folder / "alone.lock").open("a") as lock:
        # Every test passes the turnstile and then shares the lock; an `alone` test holds the
        # turnstile until it has the lock to itself, so the tests beside cannot keep it waiting.
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        alone = item.get_closest_marker("alone") is not None
        if not alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        try:
            return (yield)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(turnstile, fcntl.LOCK_UN)


def _locks_folder(config: pytest.Config) -> Path | None:
    """The folder the processes beside each other share: the lanes' (TEST_LANE_LOCKS), or the
    run's base folder of pytest-xdist's workers; None for one plain process."""
    if os.environ.get("TEST_LANE_LOCKS"):
        return Path(os.environ["TEST_LANE_LOCKS"])
    if hasattr(config, "workerinput"):
        return Path(config.option.basetemp).parent
    return None


@pytest.fixture(scope="session")
def embedder() -> SentenceTransformerEmbedder:
    import torch

    # One intra-op thread for the test process: on a busy 2-core machine torch's spinning worker
    # threads make each small embedding call some 50x slower. The tests check behaviour, not speed.
    torch.set_num_threads(1)
    return SentenceTransformerEmbedder()


@pytest.fixture(scope="session")
def sample_index(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, embedder: SentenceTransformerEmbedder
) -> Path:
    """The bundled sample corpus, indexed with the real MiniLM once per run: where pytest processes
    run side by side (the lanes, pytest-xdist's workers) the first builds it and each takes its own
    copy (servers write their retrieval counts beside the index they serve)."""
    root = tmp_path_factory.mktemp("index") / "sample"
    shared = _locks_folder(request.config)
    if shared is None:
        # The only process: this build (the quick suite's longest set-up) may use every core.
        _build_sample(root, embedder, os.cpu_count() or 1)
        return root
    built = shared / "sample-index"
    with (shared / "sample-index.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (shared / "sample-index.done").exists():
            shutil.rmtree(built, ignore_errors=True)
            _build_sample(built, embedder, 1)  # the cores are shared: one thread
            (shared / "sample-index.done").touch()
    shutil.copytree(built, root, symlinks=True)
    return root


def _build_sample(root: Path, embedder: SentenceTransformerEmbedder, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    try:
        build_index(SAMPLE_DOCS, root, embedder, progress=False)
    finally:
        torch.set_num_threads(1)
