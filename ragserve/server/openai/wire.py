"""The OpenAI chat-completions wire: a request body in, validated core params out; core events out as
chat-completion objects and chunks; domain errors as OpenAI error bodies with their HTTP status.

Messages map to the question (the last message, a user's) and the history (the user and assistant
messages before it). System and developer messages are dropped: the server's own template decides
how it answers, so a client's system prompt cannot change it. ragserve's own output (passages,
evidence, timings) travels in an extra `ragserve` field, in the protobuf's JSON form, on the first
chunk and the last one (on the whole completion when not streaming): a client that knows nothing of
it still works.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from google.protobuf.json_format import MessageToDict
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ragserve.errors import InvalidArgument
from ragserve.events import Citation, FinalSummary, LateAnswer, QueryEvent, TokenDelta
from ragserve.server.convert import query_event_pb
from ragserve.server.front import Ask
from ragserve.types import RetrievalResult

# Dropped, not refused: clients (LangChain, LlamaIndex) send a system prompt by default.
_SILENT_ROLES = ("system", "developer")


class TextPart(BaseModel):
    """One part of a message's content; only text is understood."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class ChatRequest(BaseModel):
    """The fields ragserve reads; others an SDK sends (user, store, metadata...) are ignored."""

    model_config = ConfigDict(extra="ignore")
    model: str = ""
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=0)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    # Unset: 0 (greedy), as on gRPC, not OpenAI's 1: a RAG answer should be the likeliest one.
    temperature: float | None = None
    n: Literal[1] = 1
    # ragserve's own (the OpenAI SDKs pass them as extra_body).
    top_k: int = 0
    budget_ms: int = 0
    context_token_budget: int | None = None
    dedupe_documents: bool = False
    request_class: Literal["interactive", "batch"] | None = None
    filter: dict[str, Any] | None = None
    # OpenAI fields that would change what the answer means; read only to refuse them (MEANING_FIELDS).
    stop: Any = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    response_format: Any = None
    logprobs: Any = None
    top_logprobs: Any = None


# A field a caller sets expecting a different answer than ragserve gives (stop sequences, tool calls,
# a JSON schema, log-probabilities) is refused, not silently ignored; its values that ask for
# nothing (OpenAI's own defaults) pass.
MEANING_FIELDS = ("stop", "tools", "tool_choice", "functions", "function_call", "response_format", "logprobs")
_ASKS_NOTHING: tuple[object, ...] = (None, False, [], "", "none", {"type": "text"})


class Asked(BaseModel):
    """The request, split as the core wants it: the question, the turns before it (role, text) with
    their positions among the messages (errors name `messages[i]`)."""

    question: str
    question_at: int
    turns: list[tuple[str, str]]
    positions: list[int]


def parse_chat(body: bytes) -> tuple[ChatRequest, Asked]:
    """The body checked: malformed JSON, a wrong type, an unknown role or a last message that is not
    the user's are InvalidArgument naming the field."""
    try:
        request = ChatRequest.model_validate_json(body)
    except ValidationError as exc:
        error = exc.errors()[0]
        if error["type"] == "json_invalid":
            raise InvalidArgument("body", f"is not valid JSON ({error['msg']})") from None
        raise InvalidArgument(_field_path(error["loc"]), error["msg"]) from None
    for name in (*MEANING_FIELDS, "top_logprobs"):
        if getattr(request, name) not in _ASKS_NOTHING:
            raise InvalidArgument(name, "is not supported: ragserve answers with cited text from the passages only")
    last = len(request.messages) - 1
    if request.messages[last].role != "user":
        raise InvalidArgument(f"messages[{last}].role", "the last message must be the user's question")
    kept = [(i, m) for i, m in enumerate(request.messages[:last]) if m.role not in _SILENT_ROLES]
    asked = Asked(
        question=request.messages[last].text,
        question_at=last,
        turns=[(m.role, m.text) for _, m in kept],
        positions=[i for i, _ in kept],
    )
    return request, asked


def _field_path(loc: tuple[int | str, ...]) -> str:
    """pydantic's location as the JSON path a caller reads: messages[2].role (union branches out)."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("str", "list[TextPart]", "literal['text']") or part.startswith(("function-", "literal[")):
            continue
        else:
            path += f".{part}" if path else part
    return path or "body"


def ask_of(chat: ChatRequest, asked: Asked) -> Ask:
    """The front's request: the question is a message here, and so are the turns (errors name them)."""
    return Ask(
        question=asked.question,
        top_k=chat.top_k,
        budget_ms=chat.budget_ms,
        dedupe_documents=chat.dedupe_documents,
        filter=chat.filter,
        max_tokens=max_tokens_of(chat),
        temperature=temperature_of(chat),
        context_token_budget=chat.context_token_budget,
        turns=tuple(asked.turns),
        question_field=f"messages[{asked.question_at}].content",
        turns_field="messages",
        turn_positions=tuple(asked.positions),
    )


def temperature_of(request: ChatRequest) -> float:
    return 0.0 if request.temperature is None else request.temperature


def max_tokens_of(request: ChatRequest) -> int:
    """max_completion_tokens (the newer name) over max_tokens; 0: the server's default."""
    chosen = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
    return chosen or 0


# ---- replies --------------------------------------------------------------------------------------


def extra_of(event: QueryEvent) -> dict[str, Any]:
    """A core event in the `ragserve` field: the gRPC event's JSON form (docs/api.md)."""
    return dict(MessageToDict(query_event_pb(event), preserving_proto_field_name=True))


def annotation_of(citation: Citation) -> dict[str, Any]:
    """A citation in OpenAI's annotation shape: the answer span it supports and its source (the
    `ragserve` field carries the whole citation: quote, its place in the source, support)."""
    where = citation.chunk.location
    cited = {
        "start_index": citation.answer_start,
        "end_index": citation.answer_end,
        "title": citation.chunk.title or citation.chunk.doc_id,
        "url": where.locator if where is not None else citation.chunk.doc_id,
    }
    return {"type": "url_citation", "url_citation": cited}


_FINISH = {"length": "length"}  # every other finish (stop, abstained, reader) ends the text: "stop"


def finish_reason(summary: FinalSummary) -> str:
    return _FINISH.get(summary.finish_reason, "stop")


def usage_of(summary: FinalSummary) -> dict[str, Any]:
    usage = summary.usage
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.prefix_cache_hit_tokens},
    }


class Reply:
    """One completion's identity, and its chunks as they come (`chunk`) or whole (`completion`)."""

    def __init__(self, request_id: str, model: str, include_usage: bool = False) -> None:
        self.id = f"chatcmpl-{request_id}"
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage

    def _chunk(self, delta: dict[str, Any], finish: str | None, extra: dict[str, Any] | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        if extra is not None:
            body["ragserve"] = extra
        return body

    def chunks(self, event: QueryEvent) -> list[dict[str, Any]]:
        """The chunks one core event becomes (the final event: the finish, then usage if asked)."""
        if isinstance(event, RetrievalResult):
            return [self._chunk({"role": "assistant", "content": ""}, None, extra_of(event))]
        if isinstance(event, LateAnswer):
            return [self._chunk({}, None, extra_of(event))]
        if isinstance(event, Citation):
            return [self._chunk({"annotations": [annotation_of(event)]}, None, extra_of(event))]
        if isinstance(event, FinalSummary):
            out = [self._chunk({}, finish_reason(event), extra_of(event))]
            if self.include_usage:
                usage = {**self._chunk({}, None, None), "choices": [], "usage": usage_of(event)}
                out.append(usage)
            return out
        return [self._chunk({"content": event.text}, None, None)]

    def completion(self, events: list[QueryEvent]) -> dict[str, Any]:
        """A whole (not streamed) completion from every event of the Query."""
        text = "".join(e.text for e in events if isinstance(e, TokenDelta))
        extra: dict[str, Any] = {}
        annotations: list[dict[str, Any]] = []
        body: dict[str, Any] = {"id": self.id, "object": "chat.completion", "created": self.created}
        body["model"] = self.model
        finish = "stop"
        for event in events:
            if isinstance(event, RetrievalResult | LateAnswer):
                extra.update(extra_of(event))
            elif isinstance(event, Citation):
                annotations.append(annotation_of(event))
            elif isinstance(event, FinalSummary):
                extra.update(extra_of(event))
                finish = finish_reason(event)
                body["usage"] = usage_of(event)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if annotations:
            message["annotations"] = annotations
        body["choices"] = [{"index": 0, "message": message, "finish_reason": finish}]
        body["ragserve"] = extra
        return body
