"""Request validation: raw field values in, validated domain params out, InvalidArgument otherwise."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from ragserve.access import AccessPolicy
from ragserve.config import HistorySettings, Settings
from ragserve.errors import InvalidArgument
from ragserve.filters import FieldSchema, FilterLimits, parse_filter
from ragserve.types import GenerateParams, RequestClass, RetrieveParams, Turn

ROLES = ("user", "assistant")
# Marks where the oldest quoted turn was cut to fit the prompt's history characters.
_CUT = "…"

# The wire's RequestClass numbers (rag.proto); 0 (unspecified) is interactive.
_CLASSES = {0: RequestClass.INTERACTIVE, 1: RequestClass.INTERACTIVE, 2: RequestClass.BATCH}


def validate_request_class(value: int) -> RequestClass:
    """A number the proto does not name (proto3 keeps unknown enum values) is refused, not guessed."""
    if value not in _CLASSES:
        raise InvalidArgument("request_class", f"must be REQUEST_CLASS_INTERACTIVE or REQUEST_CLASS_BATCH, got {value}")
    return _CLASSES[value]


def validate_retrieve(
    settings: Settings,
    query: str,
    top_k: int,
    budget_ms: int,
    dedupe_documents: bool = False,
) -> RetrieveParams:
    text = query.strip()
    if not text:
        raise InvalidArgument("query", "must not be empty")
    if len(query) > settings.requests.max_query_chars:
        raise InvalidArgument(
            "query",
            f"must be at most {settings.requests.max_query_chars} characters, got {len(query)} "
            "(the server's RAGSERVE_MAX_QUERY_CHARS raises it)",
        )
    if "\x00" in query:
        raise InvalidArgument("query", "must not contain NUL characters")
    if top_k < 0 or top_k > settings.requests.max_top_k:
        raise InvalidArgument(
            "top_k",
            f"must be between 0 (server default) and {settings.requests.max_top_k}, got {top_k} "
            "(the server's RAGSERVE_MAX_TOP_K raises the cap)",
        )
    # Refused, not clamped: a budget above the cap is a caller's mistake (often seconds for ms).
    if budget_ms < 0 or budget_ms > settings.requests.max_budget_ms:
        raise InvalidArgument(
            "budget_ms",
            f"must be between 0 (server default) and {settings.requests.max_budget_ms}, got {budget_ms} "
            "(the server's RAGSERVE_MAX_BUDGET_MS raises the cap)",
        )
    return RetrieveParams(
        query=text,
        top_k=top_k or settings.requests.default_top_k,
        budget_ms=budget_ms or settings.requests.retrieval_budget_ms,
        dedupe_documents=dedupe_documents,
    )


def validate_generate(
    settings: Settings,
    max_tokens: int,
    temperature: float,
    context_token_budget: int | None = None,
) -> GenerateParams:
    limit = settings.generator.max_tokens_limit
    if max_tokens < 0 or max_tokens > limit:
        raise InvalidArgument(
            "max_tokens",
            f"must be between 0 (server default) and {limit}, got {max_tokens} "
            "(the server's RAGSERVE_GENERATOR_MAX_TOKENS_LIMIT raises the cap)",
        )
    if not math.isfinite(temperature) or temperature < 0.0 or temperature > 2.0:
        raise InvalidArgument("temperature", f"must be between 0 and 2, got {temperature}")
    context_limit = settings.generator.max_model_len
    if context_token_budget is not None and not 0 <= context_token_budget <= context_limit:
        raise InvalidArgument(
            "context_token_budget",
            f"must be between 0 (whole passages) and {context_limit} (the context length, "
            f"RAGSERVE_GENERATOR_MAX_MODEL_LEN), got {context_token_budget}",
        )
    return GenerateParams(
        max_tokens=max_tokens or settings.generator.default_max_tokens,
        temperature=temperature,
        context_token_budget=settings.requests.context_token_budget
        if context_token_budget is None
        else context_token_budget,
    )


def validate_history(
    settings: Settings, turns: Sequence[tuple[str, str]], field: str = "history", positions: Sequence[int] = ()
) -> tuple[Turn, ...]:
    """(role, text) pairs, oldest first, checked against the server's bounds. `field` and
    `positions` name a turn as the caller sent it (the HTTP door's `messages[3]`)."""
    bounds = settings.history
    if len(turns) > bounds.max_history_turns:
        raise InvalidArgument(
            field,
            f"must hold at most {bounds.max_history_turns} turns, got {len(turns)} "
            "(the server's RAGSERVE_MAX_HISTORY_TURNS raises it)",
        )
    checked = []
    for i, (role, text) in enumerate(turns):
        where = f"{field}[{positions[i] if positions else i}]"
        if role not in ROLES:
            raise InvalidArgument(f"{where}.role", f"must be user or assistant, got {role!r}")
        if len(text) > bounds.max_turn_chars:
            raise InvalidArgument(
                f"{where}.text",
                f"must be at most {bounds.max_turn_chars} characters, got {len(text)} "
                "(the server's RAGSERVE_MAX_TURN_CHARS raises it)",
            )
        if "\x00" in text:
            raise InvalidArgument(f"{where}.text", "must not contain NUL characters")
        if text.strip():  # an empty turn says nothing to search or to quote
            checked.append(Turn(role, text.strip()))
    return tuple(checked)


def with_history(
    bounds: HistorySettings, params: RetrieveParams, gen: GenerateParams, turns: tuple[Turn, ...]
) -> tuple[RetrieveParams, GenerateParams]:
    """The request with the parts of its history retrieval and the prompt use (validated turns)."""
    if not turns:
        return params, gen
    wanted = bounds.history_retrieval_turns
    recent = tuple(t.text for t in reversed(turns) if t.role == "user")[:wanted] if wanted else ()
    weight = bounds.history_question_weight if recent else 1.0
    params = dataclasses.replace(params, recent=recent, question_weight=weight)
    return params, dataclasses.replace(gen, history=prompt_turns(turns, bounds))


def prompt_turns(turns: tuple[Turn, ...], bounds: HistorySettings) -> tuple[Turn, ...]:
    """The latest turns within the prompt's bounds, oldest first: older turns are dropped first,
    then the oldest kept one is cut to the characters left (its end kept: it leads to the question)."""
    kept: list[Turn] = []
    left = bounds.history_prompt_chars
    for turn in reversed(turns[-bounds.history_prompt_turns :] if bounds.history_prompt_turns else ()):
        if left <= len(_CUT):
            break
        if len(turn.text) > left:
            turn = Turn(turn.role, _CUT + turn.text[len(turn.text) - left + len(_CUT) :])
        kept.append(turn)
        left -= len(turn.text)
    return tuple(reversed(kept))


class Narrowing:
    """What keeps a request to part of the corpus, the same on every door: its own filter (checked
    against the serving version's fields) and the caller's access grant, which comes from who the
    caller is, never from the request, so the caller cannot widen it."""

    def __init__(self, settings: Settings) -> None:
        grants, bounds = settings.grants, settings.filters
        self.access = AccessPolicy(grants.field, grants.grant_table(), grants.public_value)
        self._limits = FilterLimits(bounds.max_conditions, bounds.max_depth, bounds.max_values)

    def apply(
        self, params: RetrieveParams, raw_filter: object, fields: FieldSchema, caller_names: set[str]
    ) -> RetrieveParams:
        checked = parse_filter(raw_filter, fields, self._limits)
        return dataclasses.replace(params, filter=checked, grant=self.access.grant_for(caller_names))
