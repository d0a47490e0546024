"""The settings of conversations (history on Query), of the OpenAI-compatible HTTP door and of the
MCP door and the page beside it."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class HistorySettings(BaseSettings):
    """Bounds on a Query's history and how much of it retrieval and the prompt use.
    Variables: RAGSERVE_MAX_HISTORY_TURNS, RAGSERVE_HISTORY_PROMPT_TURNS, ..."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_", extra="forbid", frozen=True)

    # Most earlier turns a request may carry; beyond, INVALID_ARGUMENT (field history).
    max_history_turns: int = Field(default=32, ge=0, le=1024)
    # Most characters in one turn; beyond, INVALID_ARGUMENT (field history[i].text).
    max_turn_chars: int = Field(default=4000, ge=1)
    # The latest user turns retrieval searches with beside the question (0: the question alone).
    history_retrieval_turns: int = Field(default=1, ge=0, le=16)
    # The question's share of the query vector when user turns join it (the rest: the question
    # and those turns embedded together). Lexical search reads the question twice and the turns
    # once; the reranker reads the question and the turns. 1: the question's vector alone.
    history_question_weight: float = Field(default=0.75, ge=0.0, le=1.0)
    # The latest turns the prompt quotes between the passages and the question, and the most
    # characters they may take together (older turns are dropped first, then the oldest kept one
    # is cut): each quoted token is an uncached prompt token (time to first token).
    history_prompt_turns: int = Field(default=4, ge=0, le=64)
    history_prompt_chars: int = Field(default=1200, ge=0)


class OpenAISettings(BaseSettings):
    """The OpenAI-compatible HTTP door (POST /v1/chat/completions, GET /v1/models; docs/api.md), on
    the HTTP listener (RAGSERVE_HTTP_PORT; its settings are HttpSettings'). Variables use the
    RAGSERVE_OPENAI_ prefix."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_OPENAI_", extra="forbid", frozen=True)

    # Serve it on the HTTP listener (when RAGSERVE_HTTP_PORT is set); false leaves the listener to
    # the other HTTP doors (MCP, the page).
    enabled: bool = True
    # The model id /v1/models lists and replies carry; a request may name it or any other id.
    model_name: str = "ragserve"

    @model_validator(mode="after")
    def _named(self) -> Self:
        if not self.model_name.strip():
            raise ValueError("RAGSERVE_OPENAI_MODEL_NAME must not be empty")
        return self


class McpSettings(BaseSettings):
    """The MCP door (Model Context Protocol, streamable HTTP) at /mcp on the HTTP listener
    (RAGSERVE_HTTP_PORT; docs/api.md). Variables use the RAGSERVE_MCP_ prefix. Off by default."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_MCP_", extra="forbid", frozen=True)

    enabled: bool = False
    # The class an agent's calls run at unless a call asks (a tool's `request_class` argument or the
    # x-request-class header); at most its caller's own (RAGSERVE_CALLER_LIMITS), as on every door.
    request_class: Literal["interactive", "batch"] = "interactive"


class PageSettings(BaseSettings):
    """The page (docs/page.md): ask, watch the answer stream in, open each citation in its source,
    at /ui/ on the HTTP listener (RAGSERVE_HTTP_PORT). Variables use the RAGSERVE_PAGE_ prefix.
    Off by default."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_PAGE_", extra="forbid", frozen=True)

    # Serve the page at /ui/: its files from the package, its calls with the doors' credential.
    enabled: bool = False
