"""The client commands `ask` and `retrieve`, with the access flags every client command shares
(health_command.py, source_command.py)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from ragserve.cli.app import DEFAULT_HOST, DEFAULT_PORT, app
from ragserve.cli.filter_flag import FilterOption, filter_or_exit
from ragserve.cli.printing import print_final, print_retrieval, print_span, snippet
from ragserve.client import ClientSettings
from ragserve.errors import ConfigError, RagError

# Client access flags shared by ask, retrieve and health; each falls back to its environment variable.
TokenFileOption = Annotated[
    Path | None,
    typer.Option(help="Read the bearer token from this file (else RAGSERVE_CLIENT_AUTH_TOKEN, RAGSERVE_AUTH_TOKEN)"),
]
TlsOption = Annotated[
    bool | None,
    typer.Option("--tls/--no-tls", help="TLS with the system's roots (RAGSERVE_CLIENT_TLS)", show_default=False),
]
TlsCaOption = Annotated[
    str | None, typer.Option(help="CA of the server's certificate; implies TLS (RAGSERVE_CLIENT_TLS_CA_FILE)")
]
TlsCertOption = Annotated[str | None, typer.Option(help="Client certificate for mTLS (RAGSERVE_CLIENT_TLS_CERT_FILE)")]
TlsKeyOption = Annotated[str | None, typer.Option(help="Client key for mTLS (RAGSERVE_CLIENT_TLS_KEY_FILE)")]
TlsServerNameOption = Annotated[
    str | None, typer.Option(help="Name the server's certificate must carry (RAGSERVE_CLIENT_TLS_SERVER_NAME)")
]


@dataclass(frozen=True)
class ClientFlags:
    """The flags every client command takes: where the server is, and how to prove who we are."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    uds: str = ""
    token_file: Path | None = None
    tls: bool | None = None
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_server_name: str | None = None

    @property
    def target(self) -> str:
        from ragserve.client import target_for

        return target_for(self.host, self.port, self.uds)

    def access(self) -> ClientSettings:
        """Flags over the environment."""
        overrides: dict[str, object] = {
            key: value
            for key, value in (
                ("tls", self.tls),
                ("tls_ca_file", self.tls_ca_file),
                ("tls_cert_file", self.tls_cert_file),
                ("tls_key_file", self.tls_key_file),
                ("tls_server_name", self.tls_server_name),
            )
            if value is not None
        }
        if self.token_file is not None:
            try:
                overrides["auth_token"] = self.token_file.read_text().strip()
            except OSError as exc:
                raise ConfigError(f"cannot read the token file: {exc}") from exc
        return ClientSettings(**overrides)  # type: ignore[arg-type]


def _flag(name: str, annotation: object) -> inspect.Parameter:
    default = getattr(ClientFlags, name)
    return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=annotation)


_ADDRESS_FLAGS = [_flag("host", str), _flag("port", int), _flag("uds", str)]
_ACCESS_FLAGS = [
    _flag("token_file", TokenFileOption),
    _flag("tls", TlsOption),
    _flag("tls_ca_file", TlsCaOption),
    _flag("tls_cert_file", TlsCertOption),
    _flag("tls_key_file", TlsKeyOption),
    _flag("tls_server_name", TlsServerNameOption),
]


def client_command(command: Callable[..., None]) -> Callable[..., None]:
    """Give `command` the address and access flags; it receives them as one `flags: ClientFlags`.

    The flags are declared once, here: typer reads the wrapper's signature, which lists the
    address flags where `flags` stands and the access flags last.
    """
    own = inspect.signature(command, eval_str=True)
    names = list(own.parameters)
    at = names.index("flags")
    params = list(own.parameters.values())
    flag_names = [p.name for p in (*_ADDRESS_FLAGS, *_ACCESS_FLAGS)]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        flags = ClientFlags(**{name: kwargs.pop(name) for name in flag_names})
        command(**kwargs, flags=flags)

    signature = own.replace(parameters=[*params[:at], *_ADDRESS_FLAGS, *params[at + 1 :], *_ACCESS_FLAGS])
    wrapper.__signature__ = signature  # type: ignore[attr-defined]
    return wrapper


def fail(exc: Exception, code: int = 2) -> NoReturn:
    typer.echo(f"error: {exc}", err=True)
    raise typer.Exit(code) from None


def run_client(main: Callable[[], Coroutine[Any, Any, None]], target: str) -> None:
    """Run one client session: exit 1 when the call fails, 2 when the flags or environment are wrong."""
    import grpc

    from ragserve.client import explain_status

    try:
        asyncio.run(main())
    except grpc.aio.AioRpcError as exc:
        typer.echo(f"error: {explain_status(exc.code(), exc.details() or '', target)}", err=True)
        raise typer.Exit(1) from None
    except RagError as exc:
        fail(exc)


@app.command()
@client_command
def ask(
    question: Annotated[str | None, typer.Argument(help="The question (with --chat: the first one)")] = None,
    flags: ClientFlags = ClientFlags(),  # a default only so the question may have one (typer reads the wrapper)
    top_k: int = 0,
    max_tokens: int = 0,
    context_tokens: Annotated[
        int | None, typer.Option(help="passage tokens in the prompt (0: whole passages; default: the server's)")
    ] = None,
    timeout: float = 60.0,
    batch: Annotated[bool, typer.Option(help="Ask as batch work: yields to interactive requests")] = False,
    filter_json: FilterOption = None,
    chat: Annotated[
        bool, typer.Option("--chat", "-i", help="Keep asking follow-ups; each carries the conversation so far")
    ] = False,
) -> None:
    """Stream an answer: citations first, then tokens as they arrive, then timings."""
    from ragserve.cli.conversation import converse
    from ragserve.client import RagClient

    narrowing = filter_or_exit(filter_json)
    if question is None and not chat:
        fail(ValueError("give a question, or --chat to type them"))

    async def run() -> None:
        access = flags.access()
        async with RagClient(flags.target, default_timeout_s=timeout, access=access) as client:

            async def one(asked: str, history: list[tuple[str, str]]) -> str:
                events = client.query(
                    asked,
                    top_k=top_k,
                    max_tokens=max_tokens,
                    context_token_budget=context_tokens,
                    request_class="batch" if batch else "interactive",
                    filter=narrowing,
                    history=history,
                )
                return await _show(events, time.perf_counter())

            await (converse(one, question) if chat else one(question or "", []))

    run_client(run, flags.target)


async def _show(events: AsyncIterator[Any], started: float) -> str:
    """Print one Query's events as they come; the answer's text."""
    passages: list[Any] = []
    late: list[Any] = []  # the reader's span when it came between the tokens: shown after them
    text: list[str] = []
    async for event in events:
        kind = event.WhichOneof("event")
        if kind == "retrieval":
            passages = list(event.retrieval.passages)
            print_retrieval(event.retrieval)
        elif kind == "token":
            text.append(event.token.text)
            print(event.token.text, end="", flush=True)
        elif kind == "answer":
            late.append(event.answer)
        elif kind == "final":
            for answer in late:
                print()
                print_span(answer.answer if answer.HasField("answer") else None, passages, answer.reader_ms)
            print_final(event.final, time.perf_counter() - started)
    return "".join(text)


@app.command()
@client_command
def retrieve(
    question: Annotated[str, typer.Argument(help="The query")],
    flags: ClientFlags,
    top_k: int = 0,
    dedupe: Annotated[bool, typer.Option(help="At most one passage (its best chunk) per document")] = False,
    budget_ms: Annotated[int, typer.Option(help="Retrieval+rerank budget; 0: the server's")] = 0,
    batch: Annotated[bool, typer.Option(help="Ask as batch work: yields to interactive requests")] = False,
    answer_span: Annotated[
        bool, typer.Option(help="The reader's answer span too, when it fits what is left of the budget")
    ] = False,
    filter_json: FilterOption = None,
) -> None:
    """Retrieval only: passages, scores, stage timings and reranking depth."""
    from ragserve.client import RagClient

    narrowing = filter_or_exit(filter_json)

    async def run() -> None:
        async with RagClient(flags.target, access=flags.access()) as client:
            r = await client.retrieve(
                question,
                top_k=top_k,
                budget_ms=budget_ms,
                dedupe_documents=dedupe,
                request_class="batch" if batch else "interactive",
                answer_span=answer_span,
                filter=narrowing,
            )
            if r.cache_hit:
                print(f"(from the retrieval cache, index v{r.index_version})")
            for p in r.passages:
                print(f"[{p.rank}] {p.doc_id} ({p.chunk_id}) score={p.score:.3f}")
                print(f"    {snippet(p.text)}")
            t = r.timings
            print(
                f"embed {t.embed_ms:.1f} ms, search {t.search_ms:.1f} ms, rerank {t.rerank_ms:.1f} ms, "
                f"total {t.retrieval_total_ms:.1f} ms"
            )
            if r.rerank_tiers:
                print("reranked: " + ", ".join(r.rerank_tiers))
            if r.HasField("answer"):
                print_span(r.answer, list(r.passages), t.reader_ms)
            skipped = [note for note in r.degraded.notes if note.startswith("reader")]
            if answer_span and skipped:
                print(f"({skipped[0]})")  # the reader did not fit what was left of the budget

    run_client(run, flags.target)
