"""Which passages retrieval ranks first most often: the ones worth keeping in the engine's KV cache.

The server counts the top passage of every Query (the one the reusable prompt layout renders the
same for every question) and persists the counts next to the index, so a restart or a newly
published version can pre-fill the engine's prefix cache with them before traffic needs them.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections import Counter
from pathlib import Path

log = logging.getLogger(__name__)

_FORMAT = 1
# Ten thousand ids with counts take well under 1 MiB; anything much larger is not ours.
_MAX_FILE_BYTES = 8 << 20
_MAX_COUNT = 1 << 62


class HotPassages:
    def __init__(self, path: Path | None, max_tracked: int = 10_000, half_life: int = 10_000) -> None:
        """`path`: where the counts persist (None: in memory only). At most `max_tracked` chunk ids
        are kept: past that, the least retrieved half is forgotten. Every `half_life` records all
        counts halve, so what was asked long ago (or one caller's burst of repeats) gives way to
        what is asked now instead of pinning the warm set for ever."""
        self.path = path
        self.max_tracked = max_tracked
        self.half_life = half_life
        self._counts: Counter[str] = Counter()
        self._since_decay = 0
        self._dirty = False
        self._save_failed = False

    def record(self, chunk_id: str) -> None:
        self._counts[chunk_id] += 1
        self._dirty = True
        self._since_decay += 1
        if self._since_decay >= self.half_life:
            self._since_decay = 0
            self._counts = Counter({k: v // 2 for k, v in self._counts.items() if v >= 2})
        if len(self._counts) > self.max_tracked:
            self._counts = Counter(dict(self._counts.most_common(self.max_tracked // 2)))

    def top(self, n: int) -> list[str]:
        return [chunk_id for chunk_id, _ in self._counts.most_common(n)]

    def load(self) -> None:
        """Counts saved by an earlier run; an unreadable file is ignored (counting starts over)."""
        if self.path is None or not self.path.is_file():
            return
        try:
            size = self.path.stat().st_size
            if size > _MAX_FILE_BYTES:
                raise ValueError(f"{size} bytes, more than {_MAX_FILE_BYTES}")
            counts = _parse_counts(self.path.read_bytes())
        except Exception as exc:  # whatever the file holds, start-up goes on without it
            log.warning(
                "ignoring the retrieval counts in %s (%s: %s); counting starts over",
                self.path,
                type(exc).__name__,
                str(exc)[:200],
            )
            return
        self._counts = Counter(dict(Counter(counts).most_common(self.max_tracked)))

    def save(self) -> None:
        """Write the counts if they changed (atomically: a reader never sees half a file). A place that
        cannot be written is reported once and tried again at the next save (a full disk, a volume
        mounted late); the counts stay in memory meanwhile."""
        if self.path is None or not self._dirty:
            return
        payload = json.dumps({"format": _FORMAT, "counts": dict(self._counts)}).encode()
        try:
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".hot-", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(payload)
                os.replace(tmp, self.path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            if not self._save_failed:
                log.warning(
                    "cannot save retrieval counts to %s (%s); set RAGSERVE_HOT_PASSAGES_PATH to a writable file "
                    "(tried again at each save)",
                    self.path,
                    exc,
                )
            self._save_failed = True
            return
        if self._save_failed:
            log.info("retrieval counts saved to %s again", self.path)
        self._save_failed = False
        self._dirty = False


def _parse_counts(data: bytes) -> dict[str, int]:
    """`{"format": 1, "counts": {chunk id: count}}` with plain positive integers only (no floats,
    no Infinity, no booleans); anything else raises ValueError."""
    parsed = json.loads(data, parse_constant=_refuse_constant)
    if not isinstance(parsed, dict) or parsed.get("format") != _FORMAT or not isinstance(parsed.get("counts"), dict):
        raise ValueError("not a counts file of format 1")
    counts = {}
    for chunk_id, count in parsed["counts"].items():
        if type(count) is not int or count < 0 or count > _MAX_COUNT:
            raise ValueError(f"a count that is not a plain integer: {str(count)[:32]!r}")
        if count:
            counts[chunk_id] = count
    return counts


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a count")
