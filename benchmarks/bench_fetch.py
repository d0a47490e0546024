"""Whether `fetch` tells an ungranted document from an unknown one by its time (docs/api.md: the
two look the same).

    python benchmarks/bench_fetch.py --out bench-results/fetch
    python benchmarks/bench_fetch.py --out /tmp/fetch-old --repo /tmp/old-tree   # another tree's server

Writes a secret document of about 100 chunks (access group `secret`) and a public one, indexes
them with the embedded default embedder, starts one real `ragserve serve` (retrieval only, caches
off) with the MCP door and two named keys: `alice` reads the secret group, `bob` only public
documents. Then, as bob, over one MCP session, alternating call by call (200 pairs after 20 of
warm-up):

- `fetch` doc_id of the secret document against doc_id of a document that does not exist;
- `fetch` chunk_id of one of its chunks against a chunk id that does not exist;

and the same two pairs in process (request/readable.py `readable_chunks` on the loaded index,
what the door runs on a worker thread), for this tree's code. Medians and p95 per kind, and the
ratio of the medians (1.00: the same time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import (  # noqa: E402
    cpu_name,
    free_port,
    git_head,
    load_avg,
    percentile,
    start_server,
    stop_server,
    write_results,
)

SECRET_DOC = "secret-plans.md"
UNKNOWN_DOC = "no-such-plans.md"
WARM_UP = 20
# Paragraphs of the secret document: with the indexer's default chunks (200 tokens, 40 of
# overlap) they make about 100 chunks.
PARAGRAPHS = 125


def write_docs(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    words = ["harbour", "ledger", "quarterly", "turbine", "orchard", "vintage", "granite", "beacon"]
    paragraphs = [
        " ".join(f"{words[(n + i) % len(words)]} {n * 31 + i}" for i in range(45)) + "." for n in range(PARAGRAPHS)
    ]
    (folder / SECRET_DOC).write_text("---\ngroups: [secret]\n---\n# Secret plans\n\n" + "\n\n".join(paragraphs))
    (folder / "public-notes.md").write_text("---\ngroups: [public]\n---\n# Public notes\n\nTides follow the moon.")


def build(out: Path) -> Path:
    index = out / "index"
    if not (index / "CURRENT").exists():
        write_docs(out / "docs")
        command = [sys.executable, "-m", "indexer", "build", str(out / "docs"), "--out", str(index), "--no-progress"]
        subprocess.run(command, check=True, cwd=REPO)
    return index


async def alternate(
    first: Callable[[], Awaitable[Any]], second: Callable[[], Awaitable[Any]], pairs: int
) -> list[list[float]]:
    """Times of `pairs` calls of each, alternating which goes first."""
    times: list[list[float]] = [[], []]
    for n in range(WARM_UP + pairs):
        order = [(0, first), (1, second)] if n % 2 == 0 else [(1, second), (0, first)]
        for slot, call in order:
            started = time.perf_counter()
            await call()
            if n >= WARM_UP:
                times[slot].append((time.perf_counter() - started) * 1000.0)
    return times


async def through_mcp(url: str, alice: str, bob: str, pairs: int) -> tuple[int, dict[str, list[list[float]]]]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async def session_calls(key: str, body: Callable[[Any], Awaitable[Any]]) -> Any:
        http = httpx2.AsyncClient(headers={"authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(30))
        async with http, Client(streamable_http_client(url, http_client=http)) as session:
            return await body(session)

    async def granted(session: Any) -> int:
        result = await session.call_tool("fetch", {"doc_id": SECRET_DOC})
        return len(result.structured_content["chunks"])

    async def timed(session: Any) -> dict[str, list[list[float]]]:
        async def fetch(arguments: dict[str, str]) -> None:
            result = await session.call_tool("fetch", arguments)
            if result.is_error or result.structured_content["found"]:
                raise SystemExit(f"fetch {arguments} as bob: {result.content[0].text[:200]}")

        return {
            "document": await alternate(
                lambda: fetch({"doc_id": SECRET_DOC}), lambda: fetch({"doc_id": UNKNOWN_DOC}), pairs
            ),
            "chunk": await alternate(
                lambda: fetch({"chunk_id": f"{SECRET_DOC}#50"}), lambda: fetch({"chunk_id": f"{UNKNOWN_DOC}#50"}), pairs
            ),
        }

    return await session_calls(alice, granted), await session_calls(bob, timed)


def in_process(index_root: Path, pairs: int) -> dict[str, list[list[float]]]:
    from ragserve.access import AccessPolicy
    from ragserve.index.hnsw import HnswIndex
    from ragserve.request.readable import readable_chunks

    index = HnswIndex.load(index_root)
    grant = AccessPolicy(field="groups", grants={"alice": ("secret",)}).grant_for({"bob"})

    def call(chunk_id: str, doc_id: str) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            if readable_chunks(index, chunk_id, doc_id, grant):
                raise SystemExit("bob read a secret chunk")

        return run

    async def both() -> dict[str, list[list[float]]]:
        return {
            "document": await alternate(call("", SECRET_DOC), call("", UNKNOWN_DOC), pairs),
            "chunk": await alternate(call(f"{SECRET_DOC}#50", ""), call(f"{UNKNOWN_DOC}#50", ""), pairs),
        }

    return asyncio.run(both())


def table(rows: dict[str, dict[str, list[list[float]]]]) -> str:
    lines = [
        "| path | fetch by | ungranted p50 / p95 (ms) | unknown p50 / p95 (ms) | ungranted / unknown at p50 |",
        "|---|---|---|---|---|",
    ]
    for path, kinds in rows.items():
        for kind, (ungranted, unknown) in kinds.items():
            u50, u95, n50, n95 = (percentile(t, q) for t in (ungranted, unknown) for q in (50, 95))
            lines.append(f"| {path} | {kind} | {u50:.3f} / {u95:.3f} | {n50:.3f} / {n95:.3f} | {u50 / n50:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--pairs", type=int, default=200)
    parser.add_argument("--repo", type=Path, default=REPO, help="the tree whose server runs (default: this one)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    index = build(args.out)
    from ragserve.api_keys import add_key

    key_file = args.out / "keys"
    key_file.unlink(missing_ok=True)
    alice, bob = add_key(key_file, "alice"), add_key(key_file, "bob")
    os.environ["RAGSERVE_CLIENT_AUTH_TOKEN"] = alice  # the start-up health probe's credential
    http_port = free_port()
    env = {
        "RAGSERVE_CACHE_BACKEND": "off",
        "RAGSERVE_GENERATION_ENABLED": "false",
        "RAGSERVE_OPENAI_PORT": str(http_port),
        "RAGSERVE_MCP_ENABLED": "true",
        "RAGSERVE_API_KEYS_FILE": str(key_file),
        "RAGSERVE_ACCESS_FIELD": "groups",
        "RAGSERVE_ACCESS_GRANTS": json.dumps({"alice": ["secret"]}),
    }
    process, _ = start_server(index, env, args.out / "server.log", repo=args.repo)
    try:
        chunks, mcp = asyncio.run(through_mcp(f"http://127.0.0.1:{http_port}/mcp", alice, bob, args.pairs))
    finally:
        stop_server(process)
    rows = {"MCP door": mcp}
    if args.repo.resolve() == REPO:
        rows["in process"] = in_process(index, args.pairs)
    tree = git_head() if args.repo.resolve() == REPO else f"server from {args.repo}"
    text = "\n".join(
        [
            f"# fetch: ungranted against unknown ({cpu_name()}, load {load_avg()}, {tree})",
            f"bob (public only) fetching a {chunks}-chunk secret document or one of its chunks, against an id that"
            f" does not exist; {args.pairs} alternating pairs after {WARM_UP} of warm-up",
            "",
            table(rows),
        ]
    )
    write_results(args.out, text, {"chunks": chunks, **rows})


if __name__ == "__main__":
    main()
