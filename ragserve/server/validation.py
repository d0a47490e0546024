"""Request validation: raw field values in, validated domain params out, InvalidArgument otherwise."""

from __future__ import annotations

import math

from ragserve.config import Settings
from ragserve.errors import InvalidArgument
from ragserve.types import GenerateParams, RequestClass, RetrieveParams

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
