"""`ragserve retrieve` against a real retrieval-only server process."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.e2e.servers import LiveServer

_PASSAGE = re.compile(r"^\[(\d+)\] (\S+) \((\S+)\) score=")


def _retrieve(server: LiveServer, *extra: str) -> list[tuple[str, str]]:
    host, _, port = server.target.rpartition(":")
    done = subprocess.run(
        [sys.executable, "-m", "ragserve.cli", "retrieve", "--host", host, "--port", port, *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "total" in done.stdout and "Traceback" not in done.stderr
    return [(m.group(2), m.group(3)) for line in done.stdout.splitlines() if (m := _PASSAGE.match(line))]


def test_retrieve_dedupe_returns_one_passage_per_document(retrieval_server: LiveServer) -> None:
    question = "How does the retrieval cache behave when Redis is down?"
    plain = _retrieve(retrieval_server, question, "--top-k", "20")
    deduped = _retrieve(retrieval_server, question, "--top-k", "20", "--dedupe")
    assert len(plain) == 20
    docs = [doc for doc, _ in deduped]
    assert deduped and len(docs) == len(set(docs))
    # Deduping looks deeper, so it never returns fewer distinct documents than the plain list holds.
    assert len(docs) >= len({doc for doc, _ in plain})
