from __future__ import annotations

import fcntl
import os
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
    from tests.e2e.servers import session_module_group

    for item in items:
        if E2E_TESTS in item.path.parents:
            item.add_marker(pytest.mark.e2e)
    _check_session_modules(items)
    if hasattr(config, "workerinput"):
        # A pytest-xdist worker: the shared servers' modules first, so that with
        # --no-loadscope-reorder the scheduler hands out those groups, the longest, before the rest.
        items.sort(key=lambda item: session_module_group(_relative(item)) is None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`--dist loadfile` (deploy/local/test.sh): each file on one worker, as pytest-xdist does, and
    the files that share a session server together (tests/e2e/servers.py SESSION_MODULES).
    pytest-xdist's own `loadgroup` cannot do it here: its group marks do not reach the scheduler
    with pytest 9.2's node ids (pytest-xdist issue 1386)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    from tests.e2e.servers import session_module_group

    class SharedServersScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return session_module_group(path) or path

    return SharedServersScheduling(config, log)  # type: ignore[arg-type]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    """Under pytest-xdist a test marked `alone` runs while no other worker runs a test (its set-up
    and tear-down included): it waits for the test running beside it to end, and holds the next
    one back. Its fixtures stay shared."""
    workerinput = getattr(item.config, "workerinput", None)
    if workerinput is None:
        return (yield)
    # The run's base folder: each worker's own is a folder in it (pytest-xdist's popen-gwN).
    folder = Path(item.config.option.basetemp).parent
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


def _relative(item: pytest.Item) -> str:
    return item.path.relative_to(REPO).as_posix()


def _check_session_modules(items: list[pytest.Item]) -> None:
    """Fails the collection when tests/e2e/servers.py SESSION_MODULES misses a module that takes a
    shared server, or names one that no longer does: the xdist scheduler would start it twice."""
    from tests.e2e.servers import servers_taken, session_modules_mismatch

    used: dict[str, set[str]] = {}
    for item in items:
        if E2E_TESTS in item.path.parents:
            used.setdefault(_relative(item), set()).update(servers_taken(item))
    wrong = session_modules_mismatch(used)
    if wrong:
        raise pytest.UsageError("tests/e2e/servers.py SESSION_MODULES is out of date:\n" + "\n".join(wrong))


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
    """The bundled sample corpus, indexed once per test session with the real MiniLM."""
    import torch

    root = tmp_path_factory.mktemp("index") / "sample"
    # A plain `pytest` is the only process, so this build (the quick suite's longest set-up) may use
    # every core: it takes about half as long on two. A pytest-xdist worker shares them: one thread.
    alone = not hasattr(request.config, "workerinput")
    torch.set_num_threads((os.cpu_count() or 1) if alone else 1)
    try:
        build_index(SAMPLE_DOCS, root, embedder, progress=False)
    finally:
        torch.set_num_threads(1)
    return root
