"""What a stored entry must show before it is read: a bounded size and, with a key configured, a MAC.

Whoever can write to a shared Redis could otherwise plant passages or answer text that every
sidecar serves. With RAGSERVE_CACHE_HMAC_KEY (or _KEY_FILE) set, each entry is written as
tag + HMAC-SHA256(key, storage key + payload) + payload, and one without a valid MAC is refused.
The MAC covers the storage key, so a genuine entry copied under another question's key is refused
too. Without a key, entries are plain payloads (a sealed one then fails to parse: a miss).
"""

from __future__ import annotations

import hashlib
import hmac

from ragserve.cache.base import RejectedEntry
from ragserve.config import CacheSettings, default_of

MIN_KEY_BYTES = 16

_TAG = b"h1:"  # a plain payload is a JSON object and starts with "{"
_MAC_BYTES = hashlib.sha256().digest_size


class EntrySeal:
    def __init__(self, max_bytes: int = default_of(CacheSettings, "max_entry_bytes"), key: bytes | None = None) -> None:
        if max_bytes < 1:
            raise ValueError("max_bytes must be >= 1")
        if key is not None and len(key) < MIN_KEY_BYTES:
            raise ValueError(f"the cache HMAC key must be at least {MIN_KEY_BYTES} bytes")
        self.max_bytes = max_bytes
        self._key = key

    @property
    def authenticated(self) -> bool:
        return self._key is not None

    def _mac(self, storage_key: str, payload: bytes) -> bytes:
        mac = hmac.new(self._key or b"", digestmod=hashlib.sha256)
        mac.update(storage_key.encode())
        mac.update(b"\x00")  # storage keys never contain NUL: key and payload cannot run together
        mac.update(payload)
        return mac.digest()

    def seal(self, storage_key: str, payload: bytes) -> bytes | None:
        """The bytes to store, or None when the entry would exceed the size cap (not stored)."""
        raw = payload if self._key is None else _TAG + self._mac(storage_key, payload) + payload
        return raw if len(raw) <= self.max_bytes else None

    def open(self, storage_key: str, raw: bytes) -> bytes:
        """The payload of a stored entry; RejectedEntry if it is too large or not authentic."""
        if len(raw) > self.max_bytes:
            raise RejectedEntry("too_large", f"{len(raw)} bytes, the cap is {self.max_bytes}")
        if self._key is None:
            return raw
        head = len(_TAG) + _MAC_BYTES
        if len(raw) < head or not raw.startswith(_TAG):
            raise RejectedEntry("unauthenticated", "no MAC")
        payload = raw[head:]
        if not hmac.compare_digest(raw[len(_TAG) : head], self._mac(storage_key, payload)):
            raise RejectedEntry("unauthenticated", "MAC does not match")
        return payload
