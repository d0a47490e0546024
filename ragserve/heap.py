"""The cyclic garbage collector and a long-lived server's heap.

A server's start-up leaves about half a million objects that live as long as it does (the modules
of torch, transformers and vLLM, the models, the first index version). Each full collection walks
them all: about a quarter of a second with every request waiting on the GIL, a few times a minute
under load (BENCHMARKS.md, "A million passages"). Frozen once SERVING, they are no longer walked;
a full collection then scans only what requests and reloads made since.
"""

from __future__ import annotations

import gc
import time


def freeze_start_up_heap() -> tuple[int, float]:
    """Collects once, then moves every object alive now out of the collector's sight. Frozen
    objects that later become garbage are still freed when nothing refers to them (reference
    counting); only one left in a reference cycle would stay. Returns how many objects were
    frozen and the seconds the collection took."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count(), time.perf_counter() - started
