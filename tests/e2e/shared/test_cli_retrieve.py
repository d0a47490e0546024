"""`ragserve retrieve` against a real retrieval-only server process."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import psutil

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


def test_retrieve_shows_a_snippet_and_says_when_it_came_from_the_cache(retrieval_server: LiveServer) -> None:
    host, _, port = retrieval_server.target.rpartition(":")
    # A budget no loaded host runs out of: a result cut short by the budget is never cached.
    command = [sys.executable, "-m", "ragserve.cli", "retrieve", "--host", host, "--port", port, "--budget-ms", "10000"]
    command.append("tides moon gravity")
    first, second = (subprocess.run(command, capture_output=True, text=True, timeout=60) for _ in range(2))
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    lines = first.stdout.splitlines()
    passage = next(i for i, line in enumerate(lines) if _PASSAGE.match(line))
    assert lines[passage + 1].startswith("    ") and len(lines[passage + 1].strip()) > 10  # the passage's start
    assert "from the retrieval cache" not in first.stdout and "from the retrieval cache" in second.stdout


def test_retrieve_with_answer_span_prints_the_readers_span_and_its_sentence(retrieval_server: LiveServer) -> None:
    host, _, port = retrieval_server.target.rpartition(":")
    command = [sys.executable, "-m", "ragserve.cli", "retrieve", "--host", host, "--port", port]
    command.append("Who discovered penicillin?")
    # A budget with room for the reader whatever the machine's load.
    done = subprocess.run(
        [*command, "--answer-span", "--budget-ms", "1000"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("reader ("))
    span = re.match(r'reader \(\d+ ms\): "(.+)" in \[\d+\]', lines[at])
    assert span is not None, done.stdout  # the span (whatever the small reader picks) and where it is
    assert span.group(1) in lines[at + 1], done.stdout  # then the sentence holding it
    plain = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert "reader (" not in plain.stdout  # the reader runs only when asked


def test_retrieve_with_a_filter_keeps_to_it_and_a_bad_one_is_named(retrieval_server: LiveServer) -> None:
    question = "How does the retrieval cache behave when Redis is down?"
    only = (
        '{"must": [{"key": "file_type", "match": {"value": "md"}}], "must_not": [{"key": "folder", "exists": false}]}'
    )
    passages = _retrieve(retrieval_server, question, "--top-k", "10", "--filter", only)
    assert len(passages) == 10 and all(doc.endswith(".md") for doc, _ in passages)
    host, _, port = retrieval_server.target.rpartition(":")
    command = [sys.executable, "-m", "ragserve.cli", "retrieve", "--host", host, "--port", port, question]
    unknown = subprocess.run(
        [*command, "--filter", '{"must": [{"key": "colour", "match": {"value": "red"}}]}'],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unknown.returncode == 1 and "filter.must[0].key" in unknown.stderr and "Traceback" not in unknown.stderr
    malformed = subprocess.run([*command, "--filter", "{not json"], capture_output=True, text=True, timeout=60)
    assert malformed.returncode == 2 and "filter" in malformed.stderr and "Traceback" not in malformed.stderr


def _graph_helpers(server: LiveServer) -> list[psutil.Process]:
    children = psutil.Process(server.process.pid).children()
    return [c for c in children if "ragserve.index.graph_process" in " ".join(c.cmdline())]


def test_a_killed_graph_helper_is_loaded_again_and_retrieval_goes_on(retrieval_server: LiveServer) -> None:
    """The server's graph lives in a helper process (RAGSERVE_INDEX_GRAPH_PROCESS_MIN_CHUNKS=0):
    kill -9 it, and the next Retrieve loads the graph again and answers what it answered before."""
    question = "What causes ocean tides?"
    before = _retrieve(retrieval_server, question, "--top-k", "5")
    helpers = _graph_helpers(retrieval_server)
    assert len(helpers) == 1
    helpers[0].kill()  # a zombie until the server notices at its next search and reaps it
    # Another top_k: not an answer from the retrieval cache.
    assert _retrieve(retrieval_server, question, "--top-k", "6")[:5] == before
    deadline = time.monotonic() + 10
    while "loading the graph again" not in retrieval_server.log_tail() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "loading the graph again" in retrieval_server.log_tail()
    assert [h.pid for h in _graph_helpers(retrieval_server) if h.status() != psutil.STATUS_ZOMBIE] not in (
        [],
        [helpers[0].pid],
    )
