from __future__ import annotations

import math

import pytest

from ragserve.config import RequestSettings, Settings
from ragserve.errors import InvalidArgument
from ragserve.server.validation import validate_generate, validate_request_class, validate_retrieve
from ragserve.types import RequestClass

SETTINGS = Settings()


@pytest.mark.parametrize(
    ("query", "top_k", "budget_ms", "field"),
    [
        ("", 5, 0, "query"),
        ("   \n", 5, 0, "query"),
        ("x" * (SETTINGS.requests.max_query_chars + 1), 5, 0, "query"),
        ("a\x00b", 5, 0, "query"),
        ("ok", -1, 0, "top_k"),
        ("ok", SETTINGS.requests.max_top_k + 1, 0, "top_k"),
        ("ok", 5, -5, "budget_ms"),
        ("ok", 5, 10_000_000, "budget_ms"),
    ],
)
def test_bad_retrieve_fields_name_the_field(query: str, top_k: int, budget_ms: int, field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        validate_retrieve(SETTINGS, query, top_k, budget_ms)
    assert info.value.field == field


def test_budget_above_the_server_cap_is_refused_not_clamped() -> None:
    capped = Settings(requests=RequestSettings(max_budget_ms=500))
    assert validate_retrieve(capped, "ok", 5, 500).budget_ms == 500
    with pytest.raises(InvalidArgument) as info:
        validate_retrieve(capped, "ok", 5, 501)
    assert info.value.field == "budget_ms" and "500" in info.value.description


def test_defaults_fill_zero_values() -> None:
    params = validate_retrieve(SETTINGS, "  what is x? ", 0, 0)
    assert params.query == "what is x?"
    assert params.top_k == SETTINGS.requests.default_top_k
    assert params.budget_ms == SETTINGS.requests.retrieval_budget_ms


@pytest.mark.parametrize(
    ("max_tokens", "temperature", "field"),
    [(-1, 0.0, "max_tokens"), (10**6, 0.0, "max_tokens"), (5, -0.1, "temperature"), (5, math.nan, "temperature")],
)
def test_bad_generate_fields(max_tokens: int, temperature: float, field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        validate_generate(SETTINGS, max_tokens, temperature)
    assert info.value.field == field


def test_request_class_unspecified_is_interactive_and_unknown_numbers_are_refused() -> None:
    assert validate_request_class(0) is RequestClass.INTERACTIVE
    assert validate_request_class(1) is RequestClass.INTERACTIVE
    assert validate_request_class(2) is RequestClass.BATCH
    for value in (3, -1, 1 << 20):
        with pytest.raises(InvalidArgument) as caught:
            validate_request_class(value)
        assert caught.value.field == "request_class"
