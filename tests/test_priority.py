"""Background work at a lower CPU priority: its result or its error comes back, and only the
thread that did it was lowered."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from ragserve.priority import at_lower_priority


def _own_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_the_work_runs_lower_and_the_caller_stays_where_it_was() -> None:
    before = _own_nice()
    assert at_lower_priority(_own_nice, 5) == min(19, before + 5)
    assert _own_nice() == before
    assert at_lower_priority(_own_nice, 0) == before  # 0: on the caller's own thread


def test_the_result_and_the_error_come_back() -> None:
    assert at_lower_priority(lambda: 42) == 42

    def fails() -> None:
        raise ValueError("bad block")

    with pytest.raises(ValueError, match="bad block"):
        at_lower_priority(fails)
