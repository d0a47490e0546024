"""The prompt as the model reads it: its chat template over the system and user messages, then its
tokenizer. The in-process engine and the remote vLLM servers are given the very same text (as token
ids for a server), so the template prefix is identical wherever it is computed and cached."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ragserve.errors import Unavailable
from ragserve.pretrained import load_options
from ragserve.prompt import Prompt, break_special_tokens

# Token counts kept per text: fitting a Query's context counts every sentence and title of its
# passages, and the same chunks come back request after request (a few MiB at most).
_COUNTS_KEPT = 16_384
# Pads kept per warm top passage (worked out when warming pre-fills it, about 1 ms).
_PADS_KEPT = 16_384
# Ends the text the pad is measured on: the template's own text follows it, and rindex finds it even
# when a passage holds the same character.
_MARK = "\ue000"
# What can follow a prompt's shared part (build_prompt): the next passage, or the end of the passages.
_FOLLOWS = ('<passage id="2"', "</passages>")
# How the shared part ends, for measuring what blank lines after it add.
_CLOSED = "text.\n</passage>\n"


@dataclass(frozen=True, slots=True)
class _Tokenizer:
    tokenizer: Any
    special_tokens: frozenset[str]  # every special or added token it knows
    longest_token_chars: int


def _files_stamp(model: str) -> int:
    """When a local model's tokenizer files last changed (0 for a hub id)."""
    files = [Path(model) / name for name in ("tokenizer.json", "tokenizer_config.json")]
    return max((f.stat().st_mtime_ns for f in files if f.is_file()), default=0)


@lru_cache(maxsize=4)
def _tokenizer_of(model: str, stamp: int) -> _Tokenizer:
    """A model's tokenizer, loaded once a process for its files as they are (`stamp`): every
    renderer of the process only encodes with it and applies its template, which change no state."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, **load_options(model))
    added = (token.content for token in tokenizer.added_tokens_decoder.values())
    # A byte-level or SentencePiece token spells its text one character a byte or a character,
    # so its written length bounds what it decodes to (a streamed answer's length: vllm_wire.py).
    longest = max((len(token) for token in tokenizer.get_vocab()), default=0)
    return _Tokenizer(tokenizer, frozenset([*tokenizer.all_special_tokens, *added]), longest)


class ChatRenderer:
    """`block_tokens`, `pad_max_tokens`: the KV block size of the engine that reads the prompt, and
    the most blank-line tokens `render` adds so that the text a prompt shares with every question
    about its warm top passage ends on a block boundary. Only whole blocks are prefix-cached: without
    the pad a question about a warm passage computes that passage's last partial block again
    (docs/ttft.md, "Warm passages end on a block")."""

    def __init__(self, model: str, block_tokens: int = 0, pad_max_tokens: int = 0) -> None:
        self._model = model
        self._tokenizer: Any = None
        self._special_tokens: frozenset[str] = frozenset()
        self._counted = lru_cache(maxsize=_COUNTS_KEPT)(self._count)
        self._block = block_tokens
        self._pad_max = pad_max_tokens if block_tokens > 0 else 0
        self._pads = lru_cache(maxsize=_PADS_KEPT)(self._pad_for)
        self._pad_table: list[int] | None = None
        self.longest_token_chars = 0  # known once loaded

    def load(self) -> None:
        """The model's tokenizer and every special or added token it knows (what untrusted text must
        never spell out)."""
        loaded = _tokenizer_of(self._model, _files_stamp(self._model))
        self._tokenizer, self._special_tokens = loaded.tokenizer, loaded.special_tokens
        self.longest_token_chars = loaded.longest_token_chars
        self._counted.cache_clear()  # counts belong to the tokenizer that made them
        self._pads.cache_clear()
        self._pad_table = None

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
        system = break_special_tokens(prompt.system, self._special_tokens)
        shared, rest = prompt.user[: prompt.reuse_end], prompt.user[prompt.reuse_end :]
        shared, rest = (break_special_tokens(text, self._special_tokens) for text in (shared, rest))
        if shared and prompt.warmed and self._pad_max:
            shared += self._pads(system, shared)
        return self._template(system, shared + rest)

    def _template(self, system: str, user: str) -> str:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return str(self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))

    def _pad_for(self, system: str, shared: str) -> str:
        """Blank lines that bring the tokens the prompt shares with every question about its top
        passage to a whole number of KV blocks, or "" when that takes more than the most tokens
        allowed (or this tokenizer's newlines do not add up to it)."""
        rendered = self._template(system, shared + _MARK)
        prefix = rendered[: rendered.rindex(_MARK)]
        need = -self._shared_tokens(prefix) % self._block
        if need == 0 or need > self._pad_max:
            return ""
        lines = next((n for n, added in enumerate(self._pad_tokens()) if added == need), 0)
        if not lines or self._shared_tokens(prefix + "\n" * lines) % self._block:
            return ""
        return "\n" * lines

    def _shared_tokens(self, text: str) -> int:
        """How many of `text`'s tokens stay the same whichever element follows it (another passage,
        or the end of the passages): where a prompt's shared part really ends in tokens."""
        one, other = (self.encode(text + follows) for follows in _FOLLOWS)
        return next((i for i, (a, b) in enumerate(zip(one, other, strict=False)) if a != b), min(len(one), len(other)))

    def _pad_tokens(self) -> list[int]:
        """Tokens that n blank lines add after a passage's closing tag, for each n: a tokenizer
        merges runs of newlines (SmolLM2's, up to four a token)."""
        if self._pad_table is None:
            base = self._shared_tokens(_CLOSED)
            self._pad_table = [self._shared_tokens(_CLOSED + "\n" * n) - base for n in range(8 * self._pad_max + 8)]
        return self._pad_table

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text (the template already holds its special tokens as text)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def count_tokens(self, text: str) -> int:
        return self._counted(text)

    def _count(self, text: str) -> int:
        return len(self.encode(text))
