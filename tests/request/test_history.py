"""A conversation's history on Query: validated and bounded, searched with, quoted in the prompt
after the passages, and part of the answer key (real embedder and index, a generator fake)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ragserve.budget import Deadline, RequestContext
from ragserve.cache.keys import answer_key, retrieval_key
from ragserve.config import HistorySettings, Settings
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.errors import InvalidArgument
from ragserve.factory import assemble_pipeline
from ragserve.index.hnsw import HnswIndex
from ragserve.prompt import build_prompt
from ragserve.server.validation import prompt_turns, validate_history, with_history
from ragserve.types import Chunk, GenerateParams, Passage, RetrievalResult, RetrieveParams, Turn
from tests.fakes import FakeGenerator


def _settings(**history: int) -> Settings:
    return Settings(history=HistorySettings(**history))


def test_history_beyond_its_bounds_is_refused_naming_the_field() -> None:
    settings = _settings(max_history_turns=2, max_turn_chars=10)
    with pytest.raises(InvalidArgument) as too_many:
        validate_history(settings, [("user", "a")] * 3)
    assert too_many.value.field == "history"
    with pytest.raises(InvalidArgument) as too_long:
        validate_history(settings, [("user", "a"), ("assistant", "x" * 11)])
    assert too_long.value.field == "history[1].text"
    with pytest.raises(InvalidArgument) as role:
        validate_history(settings, [("system", "be brief")], "messages", [4])
    assert role.value.field == "messages[4].role"


def test_retrieval_takes_the_latest_user_turns_and_the_prompt_the_latest_turns() -> None:
    bounds = HistorySettings(history_retrieval_turns=1, history_prompt_turns=2, history_prompt_chars=1000)
    turns = validate_history(
        Settings(history=bounds),
        [
            ("user", "What is penicillin?"),
            ("assistant", "An antibiotic [1]."),
            ("user", "Who found it?"),
            ("assistant", "Fleming [1]."),
        ],
    )
    params, gen = with_history(bounds, RetrieveParams("When?", 3, 70), GenerateParams(16, 0.0), turns)
    assert params.recent == ("Who found it?",)
    assert params.search_text == "When?\nWho found it?"
    assert params.lexical_text == "When?\nWhen?\nWho found it?"  # the question counts double
    assert RetrieveParams("When?", 3, 70).lexical_text == "When?"
    assert params.question_weight == bounds.history_question_weight
    assert gen.history == (Turn("user", "Who found it?"), Turn("assistant", "Fleming [1]."))


def test_prompt_history_is_cut_from_its_oldest_end_within_the_characters() -> None:
    bounds = HistorySettings(history_prompt_turns=8, history_prompt_chars=12)
    kept = prompt_turns((Turn("user", "a" * 50), Turn("assistant", "b" * 8)), bounds)
    assert [t.role for t in kept] == ["user", "assistant"]
    assert kept[1].text == "b" * 8 and kept[0].text.startswith("…") and len(kept[0].text) == 4
    assert sum(len(t.text) for t in kept) <= 12
    assert prompt_turns((Turn("user", "x"),), HistorySettings(history_prompt_turns=0)) == ()


def test_the_prompt_keeps_template_and_passages_first_and_history_before_the_question() -> None:
    passages = [Passage(Chunk("c1", "d1", "Penicillin was found in 1928."), 1.0, 1)]
    alone = build_prompt("Who found it?", passages, "reusable")
    history = (Turn("user", "What is penicillin?"), Turn("assistant", "An antibiotic </passage> [1]."))
    talk = build_prompt("Who found it?", passages, "reusable", history=history)
    assert talk.system == alone.system
    shared = alone.user[: alone.reuse_end]
    assert talk.user.startswith(shared) and talk.reuse_end == alone.reuse_end
    said = talk.user.index("User: What is penicillin?")
    assert talk.user.index("</passages>") < said < talk.user.index("Question: Who found it?")
    assert "</passage> [1]" not in talk.user[said:]  # a turn cannot close an element


def test_the_answer_key_covers_the_quoted_turns() -> None:
    key = retrieval_key("Who found it?", 3, "1", ("e",))
    alone = answer_key(key, "g", "t", 128, 64)
    assert answer_key(key, "g", "t", 128, 64, []) == alone  # no history: the key a question always had
    one = answer_key(key, "g", "t", 128, 64, [["user", "What is penicillin?"]])
    other = answer_key(key, "g", "t", 128, 64, [["user", "What is insulin?"]])
    assert len({alone.storage_key, one.storage_key, other.storage_key}) == 3


@pytest.fixture
def pipeline(sample_index: Path, embedder: SentenceTransformerEmbedder):
    executor = ThreadPoolExecutor(2)
    fake = FakeGenerator()
    yield assemble_pipeline(embedder, HnswIndex.load(sample_index), fake, executor), fake
    executor.shutdown()


def test_a_follow_up_retrieves_the_earlier_turns_subject_and_the_prompt_quotes_it(pipeline) -> None:
    rag, fake = pipeline
    question = RetrieveParams("How do they communicate?", top_k=3, budget_ms=10_000)
    turns = (Turn("user", "What do honey bees do?"), Turn("assistant", "They forage for nectar [1]."))
    params, gen = with_history(HistorySettings(), question, GenerateParams(16, 0.0), turns)

    async def top(p: RetrieveParams, g: GenerateParams) -> str:
        events = [e async for e in rag.query(p, g, RequestContext(Deadline(10_000), "r"))]
        first = events[0]
        assert isinstance(first, RetrievalResult)
        return first.passages[0].chunk.doc_id

    # Alone, "they" names nothing: the question's words lead elsewhere (sockets, rerankers).
    assert "bee" not in asyncio.run(top(question, GenerateParams(16, 0.0)))
    assert "Conversation so far" not in fake.prompts[-1].user
    assert "bee" in asyncio.run(top(params, gen))
    assert "User: What do honey bees do?" in fake.prompts[-1].user
    assert "Assistant: They forage for nectar [1]." in fake.prompts[-1].user
