from __future__ import annotations

import os
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
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/e2e starts a real server process: marked `e2e`, so the default
    `pytest` run (see addopts in pyproject.toml) leaves it to `deploy/local/test.sh`."""
    for item in items:
        if E2E_TESTS in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def embedder() -> SentenceTransformerEmbedder:
    import torch

    # One intra-op thread for the test process: on a busy 2-core machine torch's spinning worker
    # threads make each small embedding call some 50x slower. The tests check behaviour, not speed.
    torch.set_num_threads(1)
    return SentenceTransformerEmbedder()


@pytest.fixture(scope="session")
def sample_index(tmp_path_factory: pytest.TempPathFactory, embedder: SentenceTransformerEmbedder) -> Path:
    """The bundled sample corpus, indexed once per test session with the real MiniLM."""
    root = tmp_path_factory.mktemp("index") / "sample"
    build_index(SAMPLE_DOCS, root, embedder, progress=False)
    return root
