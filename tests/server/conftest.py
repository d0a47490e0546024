"""The door tests' fixtures: every door over one front (tests/server/doors.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from tests.fakes import FakeGenerator
from tests.server.doors import CITED_ANSWER, Doors, build_access_index, serving_doors


@pytest.fixture(scope="module")
def access_index(tmp_path_factory: pytest.TempPathFactory, embedder: SentenceTransformerEmbedder) -> Path:
    return build_access_index(tmp_path_factory.mktemp("doors"), embedder)


@pytest.fixture(scope="module")
def doors(
    access_index: Path, tmp_path_factory: pytest.TempPathFactory, embedder: SentenceTransformerEmbedder
) -> Iterator[Doors]:
    key_file = tmp_path_factory.mktemp("keys") / "keys"
    with serving_doors(access_index, embedder, key_file, FakeGenerator(words=CITED_ANSWER)) as both:
        yield both


@pytest.fixture(scope="module")
def slow_doors(
    access_index: Path, tmp_path_factory: pytest.TempPathFactory, embedder: SentenceTransformerEmbedder
) -> Iterator[Doors]:
    """An answer that takes 10 s, a call that may take 2, one batch slot of three, bob one call."""
    key_file = tmp_path_factory.mktemp("slow-keys") / "keys"
    slow = FakeGenerator(words=["word "] * 40, delay_s=0.25)
    limits = {"max_call_s": 2.0, "max_in_flight": 3, "interactive_reserved": 2, "caller_limits": "bob=interactive:1"}
    with serving_doors(access_index, embedder, key_file, slow, **limits) as both:
        yield both
