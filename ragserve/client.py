"""A Python client with one long-lived channel (loopback, a Unix socket, or TLS), with a bearer token if set."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any, Literal

import grpc
from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from ragserve.addresses import is_loopback
from ragserve.config import TransportSettings, default_of
from ragserve.errors import ConfigError
from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc as pb_grpc

RequestClassName = Literal["interactive", "batch"]
REQUEST_CLASSES = {"interactive": pb.REQUEST_CLASS_INTERACTIVE, "batch": pb.REQUEST_CLASS_BATCH}
_TURN_ROLES = {"user": pb.Turn.ROLE_USER, "assistant": pb.Turn.ROLE_ASSISTANT}


def history_turns(history: Sequence[tuple[str, str]]) -> list[pb.Turn]:
    """("user" | "assistant", text) pairs as the wire's turns; another role is a ValueError here."""
    for i, (role, _) in enumerate(history):
        if role not in _TURN_ROLES:
            raise ValueError(f"history[{i}].role: must be user or assistant, got {role!r}")
    return [pb.Turn(role=_TURN_ROLES[role], text=text) for role, text in history]


# A metadata filter: the message, its JSON form (a dict, or a JSON string), or None for none.
FilterSpec = pb.Filter | dict[str, Any] | str | None


def filter_message(spec: FilterSpec) -> pb.Filter | None:
    """`spec` as the request's Filter message (ValueError naming what is wrong with its JSON form)."""
    if spec is None or isinstance(spec, pb.Filter):
        return spec
    from google.protobuf.json_format import ParseDict, ParseError

    try:
        message: pb.Filter = ParseDict(json.loads(spec) if isinstance(spec, str) else spec, pb.Filter())
    except (ParseError, ValueError) as exc:
        raise ValueError(f"filter: {exc}") from None
    return message


# Retry UNAVAILABLE (a restarting sidecar) a few times; the service config is grpc's own mechanism.
_SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "ragserve.v1.RagService"}],
                "retryPolicy": {
                    "maxAttempts": 3,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)

CHANNEL_OPTIONS = [
    ("grpc.service_config", _SERVICE_CONFIG),
    ("grpc.enable_retries", 1),
    # Ping every 30 s so idle sidecar connections stay up; the server permits 10 s.
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
]


class ClientSettings(BaseSettings):
    """How a client (RagClient; `ragserve health`, `ask`, `retrieve`) reaches a protected server.

    Environment variables use the RAGSERVE_CLIENT_ prefix. The token falls back to the server's own
    RAGSERVE_AUTH_TOKEN, so a probe run inside the server's container passes auth with no extra setting.
    """

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_CLIENT_", extra="ignore", populate_by_name=True, frozen=True)

    auth_token: str = Field(
        default="",
        repr=False,
        validation_alias=AliasChoices("RAGSERVE_CLIENT_AUTH_TOKEN", "RAGSERVE_AUTH_TOKEN", "auth_token"),
    )
    # TLS with the system's trusted roots; implied by any of the files below.
    tls: bool = False
    # The CA that signed the server's certificate (empty: the system's roots).
    tls_ca_file: str = ""
    # A client certificate and key, for a server that requires them (mTLS).
    tls_cert_file: str = ""
    tls_key_file: str = ""
    # The name the server's certificate must carry, when it is not the target's host (e.g. over a Unix socket).
    tls_server_name: str = ""

    def uses_tls(self) -> bool:
        return self.tls or bool(self.tls_ca_file or self.tls_cert_file or self.tls_key_file or self.tls_server_name)


def target_for(
    host: str = default_of(TransportSettings, "host"),
    port: int = default_of(TransportSettings, "port"),
    uds_path: str = "",
) -> str:
    return f"unix:{uds_path}" if uds_path else f"{host}:{port}"


def _host(address: str) -> str:
    if address.startswith("["):
        return address[1:].split("]", 1)[0]
    return address.split(":", 1)[0] if address.count(":") == 1 else address


def is_local_target(target: str) -> bool:
    """A Unix socket or loopback addresses only: nothing on the way can read plaintext."""
    if target.startswith(("unix:", "unix-abstract:")):
        return True
    for scheme in ("dns:", "ipv4:", "ipv6:"):
        if target.startswith(scheme):
            target = target[len(scheme) :].rsplit("/", 1)[-1]  # dns://resolver/host:port
            break
    return all(is_loopback(_host(address)) for address in target.split(","))


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise ConfigError(f"cannot read the client's {what} ({exc})") from exc


def channel_credentials(access: ClientSettings) -> grpc.ChannelCredentials | None:
    """TLS credentials from the files named in `access`, or None for plaintext."""
    if not access.uses_tls():
        return None
    if bool(access.tls_cert_file) != bool(access.tls_key_file):
        raise ConfigError("a client certificate needs its key and a key its certificate (tls_cert_file, tls_key_file)")
    return grpc.ssl_channel_credentials(
        root_certificates=_read(access.tls_ca_file, "TLS CA file") if access.tls_ca_file else None,
        private_key=_read(access.tls_key_file, "TLS key file") if access.tls_key_file else None,
        certificate_chain=_read(access.tls_cert_file, "TLS certificate file") if access.tls_cert_file else None,
    )


def channel_options(access: ClientSettings) -> list[tuple[str, object]]:
    options: list[tuple[str, object]] = list(CHANNEL_OPTIONS)
    if access.tls_server_name:
        options.append(("grpc.ssl_target_name_override", access.tls_server_name))
    return options


def call_metadata(target: str, access: ClientSettings) -> tuple[tuple[str, str], ...]:
    """The bearer token header; refused where it would cross a network in plaintext."""
    if not access.auth_token:
        return ()
    if not access.uses_tls() and not is_local_target(target):
        raise ConfigError(f"a bearer token is sent to {target} only over TLS (set a TLS CA file or tls)")
    return (("authorization", f"Bearer {access.auth_token}"),)


def open_channel(target: str, access: ClientSettings) -> grpc.aio.Channel:
    credentials = channel_credentials(access)
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=channel_options(access))
    return grpc.aio.secure_channel(target, credentials, options=channel_options(access))


class RagClient:
    """Use as `async with RagClient(target) as client:`; keep one per process and reuse it.

    `default_timeout_s` (30 s): the gRPC deadline of every call that sets no `timeout_s` of its own
    (`info` always uses it). It covers the whole call: for `query`, the retrieval and every streamed
    token until the final event, so a long answer needs a larger `timeout_s` or it ends with
    DEADLINE_EXCEEDED; retries of UNAVAILABLE (up to 3 attempts, backoff 0.1 s to 1 s) fit inside it.
    The server also bounds retrieval by the call's deadline. `timeout_s=0` means the default too.
    `access`: token and TLS files; by default read from the environment (ClientSettings)."""

    def __init__(self, target: str, default_timeout_s: float = 30.0, access: ClientSettings | None = None) -> None:
        access = access if access is not None else ClientSettings()
        self.target = target
        self.default_timeout_s = default_timeout_s
        self._metadata = call_metadata(target, access)
        self._channel = open_channel(target, access)
        self._stub = pb_grpc.RagServiceStub(self._channel)

    async def __aenter__(self) -> RagClient:
        return self

    async def __aexit__(self, *exc: tuple[type[BaseException], BaseException, TracebackType] | None) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Wait until the channel is connected (the TCP or Unix socket connection, and the TLS
        handshake when TLS is on) for at most `timeout_s` seconds (default 120 s); TimeoutError after.

        It sends no call: it does not check the token and does not wait for the server to be ready
        to answer. The server accepts connections while it is still loading the index and models
        (calls then fail with UNAVAILABLE), so to wait for SERVING poll the standard health service
        (`grpc.health.v1.Health/Check`, what `ragserve health` asks) instead."""
        await asyncio.wait_for(self._channel.channel_ready(), timeout_s)

    async def retrieve(
        self,
        query: str,
        top_k: int = 0,
        budget_ms: int = 0,
        timeout_s: float | None = None,
        dedupe_documents: bool = False,
        request_class: RequestClassName = "interactive",
        answer_span: bool = False,
        filter: FilterSpec = None,
    ) -> pb.RetrieveResponse:
        """`answer_span`: the reply also carries the reader's span when it fits the budget.
        `filter`: only documents whose metadata passes it (a pb.Filter, or its JSON form as a dict,
        e.g. {"must": [{"key": "lang", "match": {"value": "en"}}]}; docs/filters.md)."""
        request = pb.RetrieveRequest(
            query=query,
            top_k=top_k,
            budget_ms=budget_ms,
            dedupe_documents=dedupe_documents,
            request_class=REQUEST_CLASSES[request_class],
            answer_span=answer_span,
            filter=filter_message(filter),
        )
        response: pb.RetrieveResponse = await self._stub.Retrieve(
            request, timeout=timeout_s or self.default_timeout_s, metadata=self._metadata
        )
        return response

    async def query(
        self,
        query: str,
        top_k: int = 0,
        max_tokens: int = 0,
        temperature: float = 0.0,
        budget_ms: int = 0,
        timeout_s: float | None = None,
        context_token_budget: int | None = None,
        request_class: RequestClassName = "interactive",
        filter: FilterSpec = None,
        history: Sequence[tuple[str, str]] = (),
    ) -> AsyncIterator[pb.QueryEvent]:
        """Events in order: one `retrieval`, `token` deltas (with at most one `answer` among them), one
        `final`. `timeout_s` (else the client's default, 30 s) bounds the whole stream.

        `context_token_budget`: None for the server's default, 0 for whole passages.
        `request_class`: "batch" for jobs (evaluations, bulk summaries, cache warmers): they yield
        to people's requests and are refused first when the server is full.
        `history`: the conversation so far, oldest first, as ("user" | "assistant", text) pairs."""
        request = pb.QueryRequest(
            query=query,
            top_k=top_k,
            max_tokens=max_tokens,
            temperature=temperature,
            budget_ms=budget_ms,
            context_token_budget=context_token_budget,
            request_class=REQUEST_CLASSES[request_class],
            filter=filter_message(filter),
            history=history_turns(history),
        )
        call = self._stub.Query(request, timeout=timeout_s or self.default_timeout_s, metadata=self._metadata)
        try:
            async for event in call:
                yield event
        finally:
            call.cancel()  # a consumer that stops early frees the server's generation at once

    async def source(
        self, chunk_id: str, start: int | None = None, end: int | None = None, context_chars: int | None = None
    ) -> pb.SourceResponse:
        """The document text around a citation's quote (its chunk_id, quote_start, quote_end)."""
        request = pb.SourceRequest(chunk_id=chunk_id, start=start, end=end, context_chars=context_chars)
        response: pb.SourceResponse = await self._stub.Source(
            request, timeout=self.default_timeout_s, metadata=self._metadata
        )
        return response

    async def info(self) -> pb.InfoResponse:
        response: pb.InfoResponse = await self._stub.Info(
            pb.InfoRequest(), timeout=self.default_timeout_s, metadata=self._metadata
        )
        return response


# What gRPC says when nothing accepts the connection (TCP refused, no socket file, no route).
_UNREACHABLE = ("failed to connect", "connection refused", "no such file", "connect failed", "unreachable")


def explain_status(code: grpc.StatusCode, details: str, target: str) -> str:
    """One line that says what went wrong and what to do about it, for a call to `target`."""
    if code == grpc.StatusCode.UNAVAILABLE and any(words in details.lower() for words in _UNREACHABLE):
        return (
            f"nothing answers on {target}: is `ragserve serve` running there? "
            "(start it, or point --host/--port/--uds at it)"
        )
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return (
            f"the server refused the credentials ({details}): pass --token-file, or set "
            "RAGSERVE_CLIENT_AUTH_TOKEN (or RAGSERVE_AUTH_TOKEN) to the server's RAGSERVE_AUTH_TOKEN"
        )
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return (
            f"the server refused this client ({details}): it needs a client certificate it trusts "
            "(--tls-cert-file/--tls-key-file, RAGSERVE_CLIENT_TLS_CERT_FILE/_KEY_FILE)"
        )
    return f"{code.name}: {details}"
