"""The prompt as the model reads it: its chat template over the system and user messages, then its
tokenizer. The in-process engine and the remote vLLM servers are given the very same text (as token
ids for a server), so the template prefix is identical wherever it is computed and cached."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from ragserve.errors import Unavailable
from ragserve.pretrained import load_options
from ragserve.prompt import Prompt, break_special_tokens

# Token counts kept per text: fitting a Query's context counts every sentence and title of its
# passages, and the same chunks come back request after request (a few MiB at most).
_COUNTS_KEPT = 16_384


class ChatRenderer:
    def __init__(self, model: str) -> None:
        self._model = model
        self._tokenizer: Any = None
        self._special_tokens: frozenset[str] = frozenset()
        self._counted = lru_cache(maxsize=_COUNTS_KEPT)(self._count)

    def load(self) -> None:
        """The model's tokenizer and every special or added token it knows (what untrusted text must
        never spell out)."""
        from transformers import AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(self._model, **load_options(self._model))
        added = (token.content for token in self._tokenizer.added_tokens_decoder.values())
        self._special_tokens = frozenset([*self._tokenizer.all_special_tokens, *added])
        self._counted.cache_clear()  # counts belong to the tokenizer that made them

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            raise Unavailable("generator is not started")
        return self._tokenizer

    def render(self, prompt: Prompt) -> str:
        """Apply the model's chat template; the system message comes first, so it is the stable prefix.

        Both messages may hold untrusted text (the passages and the question; the naive layout puts
        the question in the system message): the tokenizer's special tokens in them are broken up
        so they tokenize as plain text. The fixed template has none, so its prefix is unchanged."""
        system, user = (break_special_tokens(text, self._special_tokens) for text in (prompt.system, prompt.user))
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return str(text)

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text (the template already holds its special tokens as text)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def count_tokens(self, text: str) -> int:
        return self._counted(text)

    def _count(self, text: str) -> int:
        return len(self.encode(text))
