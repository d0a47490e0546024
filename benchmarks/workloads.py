"""What the benchmarks ask and what runs beside the server they measure.

- SQuAD v2 questions (`<data>/questions.jsonl`), gold-span and decline checks on answers;
- BEIR queries and qrels, nDCG@10 / recall@100 of document runs;
- the recurring-documents workload and one Query through the client;
- processes: `ragserve serve` in retrieval-only mode, vLLM's OpenAI-compatible server and router,
  a redis-server, the real servicer in this process, and the random-head reranker test models.

The tests use the process helpers too (tests import from here, never the other way round).
`harness.py` keeps the plumbing: ports, the full `ragserve serve` (start_server), indexes, results.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import string
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.harness import free_port
from indexer.tune.evaluation import load_qrels as read_qrels
from indexer.tune.evaluation import load_queries as read_queries
from indexer.tune.evaluation import ndcg_at, recall_at
from ragserve.client import RagClient
from ragserve.config import AnswerSettings, Settings
from ragserve.embed.base import resolve_embedder_path
from ragserve.rerank.cross_encoder import RANDOM_HEAD_MARKER
from ragserve.server.app import make_front
from ragserve.server.grpc.server import build_grpc_server
from ragserve.server.grpc.servicer import RagServicer

if TYPE_CHECKING:
    from ragserve.request.pipeline import RagPipeline

# --- SQuAD v2 questions and answers ---------------------------------------------------------------

# An answer "declines" when it says the documents do not hold the answer (the prompt asks the model
# to say that the retrieved documents do not contain it). Matched on the lower-cased answer.
ABSTAIN_PATTERNS = (
    r"\b(?:do|does|did) not (?:contain|include|mention|say|state|specify|provide|give)\b",
    r"\b(?:don't|doesn't|didn't) (?:contain|include|mention|say|state|specify|provide|give)\b",
    r"\bnot (?:mentioned|provided|stated|specified|given|found|included)\b",
    r"\bno (?:information|mention)\b",
    r"\bnot (?:enough|sufficient) information\b",
    r"\b(?:cannot|can't|can not) be (?:answered|determined|found)\b",
    r"\b(?:cannot|can't|unable to) (?:answer|find|determine)\b",
)
_ABSTAIN = [re.compile(p) for p in ABSTAIN_PATTERNS]
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def squad_normalize(text: str) -> str:
    """SQuAD's answer normalization: lower-case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def contains_gold(answer: str, spans: list[str]) -> bool:
    padded = f" {squad_normalize(answer)} "
    return any(f" {gold} " in padded for gold in map(squad_normalize, spans) if gold)


def declines(answer: str) -> bool:
    text = answer.lower().replace("\u2019", "'")
    return any(p.search(text) for p in _ABSTAIN)


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    answers: list[str]
    impossible: bool
    doc_id: str


# Asked before measuring: first-request costs stay out of the figures.
WARMUP = Question("warmup", "What are these documents about?", [], False, "")


def load_questions(data: Path, seed: int) -> list[Question]:
    with (data / "questions.jsonl").open() as f:
        rows = [json.loads(line) for line in f if line.strip()]
    qs = [Question(r["id"], r["question"], list(r["answers"]), bool(r["impossible"]), r["doc_id"]) for r in rows]
    random.Random(seed).shuffle(qs)  # every --questions N is a mix of both articles, both kinds
    return qs


def recurring(qs: list[Question], paragraphs: int, seed: int) -> list[Question]:
    """Every question of `paragraphs` paragraphs (seeded), shuffled: documents that come back."""
    rng = random.Random(seed)
    docs = sorted({q.doc_id for q in qs})
    chosen = set(rng.sample(docs, min(paragraphs, len(docs))))
    picked = [q for q in qs if q.doc_id in chosen]
    rng.shuffle(picked)
    return picked


async def ask(client: RagClient, q: Question, max_tokens: int) -> dict[str, Any]:
    """One Query at temperature 0, as a results row: TTFT, tokens, the top passage, the shown
    passage's highlight and Support.low, and the gold-span and decline checks of the answer."""
    row: dict[str, Any] = {"id": q.id, "impossible": q.impossible, "ok": False}
    parts: list[str] = []
    started = time.perf_counter()
    async for event in client.query(q.question, max_tokens=max_tokens, temperature=0.0, timeout_s=120):
        kind = event.WhichOneof("event")
        if kind == "retrieval":
            top = event.retrieval.passages[0]
            row["top_chunk"] = top.chunk_id
            shown = event.retrieval.passages[event.retrieval.support.evidence_passage]  # what a client shows
            row["highlight"] = (
                shown.text[shown.highlight.start : shown.highlight.end] if shown.HasField("highlight") else ""
            )
            row["support_low"] = event.retrieval.support.low
            row["evidence_ms"] = event.retrieval.timings.evidence_ms
            row["retrieval_ms"] = event.retrieval.timings.retrieval_total_ms
        elif kind == "token":
            row.setdefault("ttft_ms", (time.perf_counter() - started) * 1000.0)
            parts.append(event.token.text)
        elif kind == "final":
            usage, timings = event.final.usage, event.final.timings
            row.update(
                server_ttft_ms=timings.ttft_ms,
                context_ms=timings.context_ms,
                prompt_tokens=usage.prompt_tokens,
                cached_tokens=usage.prefix_cache_hit_tokens,
                context_tokens=usage.context_tokens,
                finish=event.final.finish_reason,
                ok=True,
            )
    row["total_ms"] = (time.perf_counter() - started) * 1000.0
    row["answer"] = answer = "".join(parts)
    row["declined"] = declines(answer)
    if not q.impossible:
        row["answer_gold"] = contains_gold(answer, q.answers)
        row["highlight_gold"] = contains_gold(row.get("highlight", ""), q.answers)
    return row


async def wait_warm(client: RagClient, limit_s: float = 900.0) -> Any:
    """Info's warming state once the server's background warming has finished (a server that does
    not report warming, an older one, at once): measurements start from a settled server."""
    give_up = time.monotonic() + limit_s
    while time.monotonic() < give_up:
        reply = await client.info()
        if not reply.HasField("warming") or reply.warming.done:
            return reply.warming
        await asyncio.sleep(0.2)
    raise SystemExit(f"warming did not finish within {limit_s:g} s")


# --- BEIR queries, qrels and scores ---------------------------------------------------------------


def load_queries(data: Path) -> dict[str, str]:
    return read_queries(data / "queries.jsonl")


def load_qrels(data: Path) -> dict[str, dict[str, int]]:
    path = data / "qrels.tsv"
    return read_qrels(path if path.exists() else data / "qrels" / "test.tsv")


def evaluate(runs: dict[str, list[str]], qrels: dict[str, dict[str, int]], ids: Iterable[str]) -> dict[str, float]:
    ids = [q for q in ids if q in qrels]
    return {
        "ndcg@10": sum(ndcg_at(runs.get(q, []), qrels[q]) for q in ids) / len(ids),
        "recall@100": sum(recall_at(runs.get(q, []), qrels[q]) for q in ids) / len(ids),
        "queries": float(len(ids)),
    }


# --- `ragserve serve`, retrieval only -------------------------------------------------------------


class Server:
    """`ragserve serve` in retrieval-only mode as a subprocess on a free loopback port."""

    def __init__(self, index: Path, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        full_env = {
            **os.environ,
            "RAGSERVE_INDEX_PATH": str(index),
            "RAGSERVE_GENERATION_ENABLED": "false",
            "RAGSERVE_CACHE_BACKEND": "off",  # measure retrieval, not the cache
            "RAGSERVE_MAX_TOP_K": "100",
            "RAGSERVE_RETRIEVAL_BUDGET_MS": "10000",  # quality run: no budget cuts
            "RAGSERVE_INDEX_RELOAD_INTERVAL_S": "0",
            "RAGSERVE_LOG_LEVEL": "WARNING",
            **env,
        }
        self._log = log.open("w")
        cmd = [sys.executable, "-c", "from ragserve.cli import main; main()", "serve", "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, env=full_env, stdout=self._log, stderr=subprocess.STDOUT)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def wait_ready(self, timeout_s: float = 300.0) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        end = time.monotonic() + timeout_s
        async with grpc.aio.insecure_channel(self.target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < end:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited with {self.proc.returncode}; see {self._log.name}")
                try:
                    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.aio.AioRpcError:
                    pass
                await asyncio.sleep(0.5)
        raise TimeoutError("server did not become SERVING")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


# --- vLLM's OpenAI-compatible server and router ---------------------------------------------------

START_TIMEOUT_S = 300


@dataclass
class HttpProcess:
    """A vLLM OpenAI-compatible server or a vLLM router started by a test or a benchmark, on loopback,
    in a process group of its own: a vLLM server's engine-core and worker processes go with it (killed
    alone, the API process leaves them running, busy-polling the CPUs for the rest of the run)."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)

    def kill(self) -> None:
        """The server dies at once, all of it."""
        self._signal_group(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        self._signal_group(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=30)
        self._signal_group(signal.SIGKILL)  # whatever of the group is left
        self.process.wait()


def _spawn_http(command: list[str], log: Path, env: dict[str, str] | None = None) -> HttpProcess:
    port = free_port()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    return HttpProcess(f"http://127.0.0.1:{port}", process, log)


def spawn_vllm_server(model: Path, log: Path, cpus: str, dtype: str) -> HttpProcess:
    """`python -m vllm.entrypoints.openai.api_server` with the flags ragserve needs (docs/remote.md),
    its OpenMP threads on `cpus`."""
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--dtype", dtype,
        "--block-size", "32", "--enable-prefix-caching", "--enable-prompt-tokens-details",
        "--max-model-len", "2048", "--enforce-eager", "--max-num-seqs", "16",
    ]  # fmt: skip
    # Dev mode: POST /reset_prefix_cache, so a run can start from cold caches.
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": cpus, "VLLM_SERVER_DEV_MODE": "1"}
    return _spawn_http(command, log, env)


def reset_prefix_cache(server: HttpProcess) -> None:
    import urllib.request

    with urllib.request.urlopen(urllib.request.Request(server.url + "/reset_prefix_cache", method="POST"), timeout=30):
        pass


def spawn_router(workers: list[str], policy: str, log: Path) -> HttpProcess:
    """vLLM's router (the `vllm-router` wheel) in front of `workers`."""
    metrics = ["--prometheus-port", str(free_port())]  # its default port is shared by every router
    return _spawn_http([router_command(), "--worker-urls", *workers, "--policy", policy, *metrics], log)


def router_command() -> str:
    """The router installed beside this Python (its venv's bin, on PATH or not)."""
    beside = Path(sys.executable).parent / "vllm-router"
    return str(beside) if beside.is_file() else "vllm-router"


def wait_http_ok(server: HttpProcess, path: str = "/health", timeout_s: float = START_TIMEOUT_S) -> None:
    """Until `path` answers 200; RuntimeError with the log's tail if the process exits or time runs out."""
    import http.client
    import urllib.request

    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"{server.url} exited with {server.process.returncode} during start-up:\n{server.log_tail()}"
            )
        try:
            with urllib.request.urlopen(server.url + path, timeout=2) as reply:
                if reply.status == 200:
                    return
        except http.client.HTTPException as error:
            raise RuntimeError(
                f"{server.url}: something else than an HTTP/1 server answers there ({error!r})"
            ) from None
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{server.url} not answering {path} after {timeout_s} s:\n{server.log_tail()}")


# --- redis-server ---------------------------------------------------------------------------------


def _ping(port: int, timeout_s: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisProcess:
    """A real redis-server on a free loopback port (never a system Redis): start, kill (SIGKILL),
    pause (SIGSTOP/SIGCONT) and restart it on that port."""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (deploy/local/setup.sh installs the Debian package)")
        self.binary = binary
        self.workdir = workdir
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / f"redis-{self.port}.log"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        with self.log.open("ab") as sink:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    "--port", str(self.port),
                    "--bind", "127.0.0.1",
                    "--save", "",
                    "--appendonly", "no",
                    "--dir", str(self.workdir),
                    "--protected-mode", "yes",
                ],
                stdout=sink,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        give_up = time.monotonic() + timeout_s
        while time.monotonic() < give_up:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            if _ping(self.port):
                return
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not answer within {timeout_s} s")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def restart(self) -> None:
        self.start()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGCONT)  # a paused server cannot act on SIGTERM
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


# --- the real servicer in this process ------------------------------------------------------------


@asynccontextmanager
async def serve_pipeline(pipeline: RagPipeline, settings: Settings | None = None) -> AsyncIterator[str]:
    """The real gRPC servicer over `pipeline` on a loopback port, in this process, without the
    generator: Retrieve needs no vLLM engine, so the server-level path (validation, Deadline,
    pipeline, conversion) runs without a minute of engine start-up. Yields the target
    ("127.0.0.1:<port>"); stops the server on exit."""
    settings = settings or Settings(answer=AnswerSettings(generation_enabled=False))
    # The production wiring: server options, interceptors, health and reflection.
    server, _ = build_grpc_server(settings, RagServicer(make_front(settings, pipeline)))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


# --- random-head reranker test models -------------------------------------------------------------

# No cross-encoder weights can be downloaded where this project is built, so the tests and the
# latency benchmarks build BERT models with the exact shapes of cross-encoder/ms-marco-MiniLM-L-2-v2
# and -L-6-v2 (384 hidden, 12 heads, 1536 intermediate, 512 positions, one label) and the bundled
# MiniLM tokenizer (same BERT uncased vocabulary). Their cost per token matches the real models;
# their scores mean nothing. Each config carries a marker, and the server refuses to load a marked
# model unless RAGSERVE_RERANK_ALLOW_RANDOM_HEADS=true (benchmarks only). Never a default.
SHAPES = {"minilm-l2-random": 2, "minilm-l6-random": 6}


def build_test_model(out: Path, layers: int, seed: int = 0) -> Path:
    """Write a random-weight BERT cross-encoder with the MiniLM shape; reuse it if already there."""
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        return out
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=384,
        num_hidden_layers=layers,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
        num_labels=1,
    )
    setattr(config, RANDOM_HEAD_MARKER, True)
    out.mkdir(parents=True, exist_ok=True)
    BertForSequenceClassification(config).eval().save_pretrained(out)
    AutoTokenizer.from_pretrained(resolve_embedder_path("all-MiniLM-L6-v2")).save_pretrained(out)
    return out


def build_all(root: Path) -> dict[str, Path]:
    return {name: build_test_model(root / name, layers) for name, layers in SHAPES.items()}
