"""`ragserve ask --chat`: each question is asked with the turns before it, answers included."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from ragserve.cli import conversation
from ragserve.cli.conversation import converse


def test_each_question_carries_the_conversation_so_far(monkeypatch: pytest.MonkeyPatch) -> None:
    typed: Iterator[str] = iter(["Who founded it?", "When?", ""])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(typed))
    asked: list[tuple[str, list[tuple[str, str]]]] = []

    async def ask(question: str, history: list[tuple[str, str]]) -> str:
        asked.append((question, history))
        return f"answer {len(asked)}"

    asyncio.run(converse(ask, "What is the Bank of Sydney?"))
    assert [q for q, _ in asked] == ["What is the Bank of Sydney?", "Who founded it?", "When?"]
    assert asked[0][1] == []
    assert asked[2][1] == [
        ("user", "What is the Bank of Sydney?"),
        ("assistant", "answer 1"),
        ("user", "Who founded it?"),
        ("assistant", "answer 2"),
    ]


def test_the_terminal_keeps_only_the_latest_turns_and_stops_at_end_of_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conversation, "KEPT_TURNS", 2)
    typed = iter(["two", "three"])

    def read(prompt: str = "") -> str:
        try:
            return next(typed)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", read)
    seen: list[list[tuple[str, str]]] = []

    async def ask(question: str, history: list[tuple[str, str]]) -> str:
        seen.append(history)
        return question.upper()

    asyncio.run(converse(ask, "one"))
    assert seen[-1] == [("user", "two"), ("assistant", "TWO")]
