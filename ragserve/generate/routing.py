"""Which generation server a prompt goes to: the one that already holds its reusable KV.

The routing key is a hash of the template and the prompt's top passage; with several servers the
sidecar ranks them by rendezvous hashing on it, so the questions about one passage land where its
KV already sits and, when a server goes away, only its own keys move.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from typing import Protocol, TypeVar

from ragserve.prompt import Prompt


class _Routable(Protocol):
    @property
    def url(self) -> str: ...


S = TypeVar("S", bound=_Routable)


def routing_key(prompt: Prompt) -> str:
    """What decides the server: the template and the top passage (their KV is what can be reused).
    A hash: a router sees no document names, and a header no characters it could misread."""
    if not prompt.reuse_key:
        return ""
    return hashlib.blake2b(f"{prompt.system}\x00{prompt.reuse_key}".encode(), digest_size=12).hexdigest()


def order_servers(up: Sequence[S], key: str, routing: str, turn: itertools.count[int]) -> list[S]:
    """`up` best first for `key`: rendezvous hashing (routing "document"), or in turn (round_robin,
    or a prompt without passages)."""
    if len(up) == 1:
        return list(up)
    if routing == "round_robin" or not key:
        start = next(turn) % len(up)
        return [*up[start:], *up[:start]]
    return sorted(up, key=lambda s: hashlib.blake2b(f"{key}\x00{s.url}".encode(), digest_size=8).digest(), reverse=True)


def hedge_after_s(setting_ms: float, ttft_p95_ms: float | None) -> float | None:
    """When a second server gets the prompt: the setting, or (0) the first server's TTFT p95 once
    it has one; negative: never."""
    if setting_ms < 0:
        return None
    if setting_ms == 0:
        return None if ttft_p95_ms is None else ttft_p95_ms / 1000.0
    return setting_ms / 1000.0
