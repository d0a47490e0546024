"""Progress of a build: the embedding, its long part, as a bar on a terminal (else a plain line now
and then: a log file or a job's captured output gets lines, not carriage returns); the other
stages as a line when each starts and ends."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from tqdm import tqdm

log = logging.getLogger(__name__)

# A plain line at most this often; the first one after the first group.
LINE_INTERVAL_S = 30.0


def _eta(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds))) if seconds == seconds and seconds >= 0 else "?"


class EmbedProgress:
    """Documents embedded out of `total`, chunks/s and an ETA from the average rate so far (the
    documents resumed from checkpoints are not in `total`: they would make the rate a lie)."""

    def __init__(self, total: int, show: bool, interval_s: float = LINE_INTERVAL_S) -> None:
        self.total = total
        self.docs = 0
        self.chunks = 0
        self._started = time.perf_counter()
        self._last_line = self._started
        self._interval_s = interval_s
        terminal = show and sys.stderr.isatty()
        self._bar: Any = None
        if terminal:
            # smoothing 0.1: the ETA follows the rate of the last few groups, not one group's luck.
            self._bar = tqdm(total=total, unit="doc", unit_scale=True, smoothing=0.1, desc="embed", file=sys.stderr)
        # No terminal: plain lines on stderr when asked for progress, else to the log (--log-file).
        self._say: Callable[[str], None] | None = None
        if not terminal:
            self._say = (lambda line: print(line, file=sys.stderr, flush=True)) if show else log.info

    def update(self, docs: int, chunks: int) -> None:
        self.docs += docs
        self.chunks += chunks
        now = time.perf_counter()
        if self._bar is not None:
            self._bar.set_postfix_str(f"{self.chunks_per_second:.1f} chunks/s", refresh=False)
            self._bar.update(docs)
        elif self._say is not None and now - self._last_line >= self._interval_s:
            self._last_line = now
            self._say(self.line())

    @property
    def chunks_per_second(self) -> float:
        elapsed = time.perf_counter() - self._started
        return self.chunks / elapsed if elapsed > 0 else 0.0

    def line(self) -> str:
        elapsed = time.perf_counter() - self._started
        rate = self.docs / elapsed if elapsed > 0 else 0.0
        left = (self.total - self.docs) / rate if rate > 0 else float("nan")
        return (
            f"embedded {self.docs:,}/{self.total:,} documents ({self.chunks:,} chunks) in {_eta(elapsed)}: "
            f"{self.chunks_per_second:.1f} chunks/s, {rate:.1f} documents/s, ETA {_eta(left)}"
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self._say is not None and self.total:
            self._say(self.line())


@contextmanager
def stage(name: str, show: bool) -> Iterator[None]:
    """`name...` as it starts and `name: N s` as it ends, on stderr when showing progress, else to
    the log; the summary line adds every stage's time up."""
    say: Callable[[str], None] = (lambda line: print(line, file=sys.stderr, flush=True)) if show else log.info
    say(f"{name}...")
    started = time.perf_counter()
    yield
    say(f"{name}: {time.perf_counter() - started:.1f} s")
