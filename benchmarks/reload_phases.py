"""A hot reload under load, phase by phase, beside a probe of the host's stalls (host_stalls.py).

Retrieves go one at a time, after a warm-up pass: quiet (steady), while the next version is built
or copied beside the server, from its publish (CURRENT flips) until the server serves it (reload),
and after. Each phase reports p99 and max over all its requests, and p99 over the requests no host
stall overlapped, with the number of stalls the probe saw in it. Each request's ms and whether a
stall overlapped it come back too ("samples"), so several reloads' requests can be pooled: a
phase's p99 over a few hundred requests is its third-slowest, which one stall decides.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import percentile
from benchmarks.host_stalls import HostStallProbe
from ragserve.client import RagClient

PHASES = ("steady", "beside the build", "reload", "after")


async def reload_under_load(
    target: str, queries: list[str], index: Path, publish: Any, sample: Any = None
) -> dict[str, Any]:
    """`publish`: a blocking call that builds (or copies) and publishes the next version, returning
    a dict with "published"; `sample`: called at the end of the steady phase (its dict is kept)."""
    steady: dict[str, Any] = {}
    with HostStallProbe(index.parent / "host-stalls.txt") as probe:
        requests, served, flipped, build = await _phases(target, queries, index, publish, sample, steady)
    out: dict[str, Any] = {"samples": {}, "end of steady": steady}
    for phase in PHASES:
        taken = requests[phase]
        ms = [m for _, m in taken]
        hits = probe.overlapping(taken)
        out["samples"][phase] = list(zip(ms, hits, strict=True))
        quiet = [m for m, hit in zip(ms, hits, strict=True) if not hit]
        out[f"{phase} p99 ms"] = percentile(ms, 99)
        out[f"{phase} max ms"] = max(ms, default=0.0)
        out[f"{phase} p99 ms, no host stall"] = percentile(quiet, 99)
        out[f"{phase} requests in a host stall"] = len(ms) - len(quiet)
        if taken:
            first, last = taken[0][0], taken[-1][0] + taken[-1][1] / 1000
            out[f"{phase} host stalls"] = sum(first <= a < last for a, _ in probe.stalls())
    out |= {"reload requests": len(requests["reload"]), "reload_s": served - flipped, "add_build": build}
    return out


async def _phases(
    target: str, queries: list[str], index: Path, publish: Any, sample: Any, steady: dict[str, Any]
) -> tuple[dict[str, list[tuple[float, float]]], float, float, dict[str, Any]]:
    current = (index / "CURRENT").resolve()
    requests: dict[str, list[tuple[float, float]]] = {phase: [] for phase in PHASES}
    async with RagClient(target, default_timeout_s=30) as client:
        first = (await client.info()).index_version

        async def timed(q: str) -> tuple[float, float]:
            wall, started = time.time(), time.perf_counter()
            await client.retrieve(q, top_k=10)
            return wall, (time.perf_counter() - started) * 1000

        for q in queries:  # a warm-up pass, not recorded: the first visits fault the mapped files in
            await timed(q)
        for q in queries:
            requests["steady"].append(await timed(q))
        if sample is not None:
            steady.update(sample())
        task = asyncio.get_running_loop().run_in_executor(None, publish)
        n, flipped, served = 0, 0.0, 0.0
        while not (served and task.done() and len(requests["after"]) >= len(queries) // 2):
            n += 1
            request = await timed(queries[n % len(queries)])
            if not flipped and (index / "CURRENT").resolve() != current:
                flipped = time.perf_counter()
            if task.done() and not flipped and not task.result()["published"]:
                raise SystemExit("the +1% build published nothing: was the index already at that version?")
            if flipped and not served and (await client.info()).index_version != first:
                served = time.perf_counter()
            requests["after" if served else "reload" if flipped else "beside the build"].append(request)
        build = await task
    return requests, served, flipped, build


def pooled(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Each phase's p99 over the requests of every run in `runs`, all and without a stall's."""
    out: dict[str, float] = {}
    for phase in PHASES:
        samples = [sample for run in runs for sample in run["samples"][phase]]
        out[f"{phase} p99 ms"] = percentile([m for m, _ in samples], 99)
        out[f"{phase} p99 ms, no host stall"] = percentile([m for m, hit in samples if not hit], 99)
        out[f"{phase} requests"] = len(samples)
    return out
