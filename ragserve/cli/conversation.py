"""`ragserve ask --chat`: a conversation at the terminal, each answer asked with the turns before it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

# Turns the terminal keeps and sends (the server quotes and searches only its own latest few).
KEPT_TURNS = 16

Ask = Callable[[str, list[tuple[str, str]]], Awaitable[str]]


async def converse(ask: Ask, first: str | None = None, prompt: str = "you> ") -> None:
    """Ask `first` (if given), then every line typed until an empty line or end of input; `ask`
    streams one answer and returns its text, which joins the history the next question carries."""
    history: list[tuple[str, str]] = []
    question = first
    while True:
        if question is None:
            try:
                question = (await asyncio.to_thread(input, prompt)).strip()
            except EOFError:
                return
            if not question:
                return
        answer = await ask(question, list(history))
        history += [("user", question), ("assistant", answer)]
        del history[:-KEPT_TURNS]
        question = None
        print()
