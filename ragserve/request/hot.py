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


class HotPassages:
    def __init__(self, path: Path | None, max_tracked: int = 10_000) -> None:
        """`path`: where the counts persist (None: in memory only). At most `max_tracked` chunk ids
        are kept: past that, the least retrieved half is forgotten."""
        self.path = path
        self.max_tracked = max_tracked
        self._counts: Counter[str] = Counter()
        self._dirty = False
        self._save_failed = False

    def record(self, chunk_id: str) -> None:
        self._counts[chunk_id] += 1
        self._dirty = True
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
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("format") != _FORMAT:
                raise ValueError(f"format {data.get('format')!r}")
            counts = {str(k): int(v) for k, v in dict(data["counts"]).items() if int(v) > 0}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("ignoring the retrieval counts in %s (%s); counting starts over", self.path, exc)
            return
        self._counts = Counter(dict(Counter(counts).most_common(self.max_tracked)))

    def save(self) -> None:
        """Write the counts if they changed (atomically: a reader never sees half a file). A read-only
        place is reported once and then left alone; the counts stay in memory."""
        if self.path is None or not self._dirty or self._save_failed:
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
            self._save_failed = True
            log.warning(
                "cannot save retrieval counts to %s (%s); set RAGSERVE_HOT_PASSAGES_PATH to a writable file",
                self.path,
                exc,
            )
            return
        self._dirty = False
