"""Settings, read from the environment (RAGSERVE_ prefix) and from CLI flags: the root `Settings`
here, its sections in `sections.py` and `generator.py`, the shared helpers in `base.py`."""

from __future__ import annotations

from typing import Any, Self

from pydantic import AliasChoices, Field, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from ragserve.config.answering import AnswerSettings, WarmingSettings
from ragserve.config.base import (
    DEFAULT_EMBEDDER,
    DEFAULT_GENERATOR_NAME,
    default_generator_path,
    default_home,
    default_of,
    merged_generator_path,
)
from ragserve.config.conversation import HistorySettings, McpSettings, OpenAISettings, PageSettings
from ragserve.config.filters import FilterSettings, GrantSettings
from ragserve.config.generator import GeneratorSettings
from ragserve.config.http import HttpSettings
from ragserve.config.models import ReaderSettings, RerankSettings
from ragserve.config.sections import (
    AccessSettings,
    CacheSettings,
    EmbedderSettings,
    IndexSettings,
    LimitsSettings,
    ObservabilitySettings,
    QdrantSettings,
    RequestSettings,
    RetrievalSettings,
    TransportSettings,
    parse_caller_limits,
)

__all__ = [
    "DEFAULT_EMBEDDER",
    "DEFAULT_GENERATOR_NAME",
    "FORMER_NAMES",
    "AccessSettings",
    "AnswerSettings",
    "CacheSettings",
    "EmbedderSettings",
    "FilterSettings",
    "GeneratorSettings",
    "GrantSettings",
    "HistorySettings",
    "HttpSettings",
    "IndexSettings",
    "LimitsSettings",
    "McpSettings",
    "ObservabilitySettings",
    "OpenAISettings",
    "PageSettings",
    "QdrantSettings",
    "ReaderSettings",
    "RequestSettings",
    "RerankSettings",
    "RetrievalSettings",
    "Settings",
    "TransportSettings",
    "WarmingSettings",
    "default_generator_path",
    "default_home",
    "default_of",
    "merged_generator_path",
    "parse_caller_limits",
]

# Settings' sections, each reading its own environment variables (names as before the sections).
_SECTIONS: dict[str, type[BaseSettings]] = {
    "transport": TransportSettings,
    "access": AccessSettings,
    "index": IndexSettings,
    "qdrant": QdrantSettings,
    "embedder": EmbedderSettings,
    "retrieval": RetrievalSettings,
    "requests": RequestSettings,
    "limits": LimitsSettings,
    "observability": ObservabilitySettings,
    "generator": GeneratorSettings,
    "rerank": RerankSettings,
    "reader": ReaderSettings,
    "cache": CacheSettings,
    "answer": AnswerSettings,
    "warming": WarmingSettings,
    "filters": FilterSettings,
    "grants": GrantSettings,
    "history": HistorySettings,
    "http": HttpSettings,
    "openai": OpenAISettings,
    "mcp": McpSettings,
    "page": PageSettings,
}


def _env_name(section: type[BaseSettings], field: str) -> str:
    return f"{section.model_config.get('env_prefix', '')}{field}".upper()


def _env_names_of(section: type[BaseSettings], field: str) -> list[str]:
    """The variables a field reads, its own name first (then a former one, as HttpSettings keeps)."""
    alias = section.model_fields[field].validation_alias
    if isinstance(alias, AliasChoices):
        return [choice.upper() for choice in alias.choices if isinstance(choice, str)]
    return [_env_name(section, field)]


# Each section's variables -> the field they set ("RAGSERVE_HOST" -> "transport.host").
_SECTION_ENV = {
    env: f"{name}.{field}"
    for name, cls in _SECTIONS.items()
    for field in cls.model_fields
    for env in _env_names_of(cls, field)
}
# A variable still read under its former name -> its name now ("RAGSERVE_OPENAI_PORT" -> "RAGSERVE_HTTP_PORT").
FORMER_NAMES = {
    former: names[0]
    for cls in _SECTIONS.values()
    for field in cls.model_fields
    for names in [_env_names_of(cls, field)]
    for former in names[1:]
}
# A flat keyword of the old Settings (its variable without the prefix) -> where the field lives now.
_MOVED = {env.removeprefix("RAGSERVE_").lower(): path for env, path in _SECTION_ENV.items() if env not in FORMER_NAMES}


class _OwnFieldsEnv(EnvSettingsSource):
    """Settings' own fields from the environment; a section reads its variables itself, so a
    variable named like a section (RAGSERVE_INDEX, RAGSERVE_CACHE) is not parsed as one."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        if field_name in _SECTIONS:
            return None, field_name, False
        return super().get_field_value(field, field_name)


class Settings(BaseSettings):
    """Everything the server needs, in sections. Environment variables use the RAGSERVE_ prefix;
    each section reads its own (RAGSERVE_HOST -> transport.host, RAGSERVE_INDEX_PATH -> index.path).
    Immutable: derive a changed copy with model_copy(update=...)."""

    model_config = SettingsConfigDict(env_prefix="RAGSERVE_", extra="forbid", frozen=True)

    transport: TransportSettings = Field(default_factory=TransportSettings)
    access: AccessSettings = Field(default_factory=AccessSettings)
    index: IndexSettings = Field(default_factory=IndexSettings)
    qdrant: QdrantSettings = Field(default_factory=QdrantSettings)
    embedder: EmbedderSettings = Field(default_factory=EmbedderSettings)
    retrieval: RetrievalSettings = Field(default_factory=RetrievalSettings)
    requests: RequestSettings = Field(default_factory=RequestSettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    observability: ObservabilitySettings = Field(default_factory=ObservabilitySettings)
    generator: GeneratorSettings = Field(default_factory=GeneratorSettings)
    rerank: RerankSettings = Field(default_factory=RerankSettings)
    reader: ReaderSettings = Field(default_factory=ReaderSettings)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    answer: AnswerSettings = Field(default_factory=AnswerSettings)
    warming: WarmingSettings = Field(default_factory=WarmingSettings)
    filters: FilterSettings = Field(default_factory=FilterSettings)
    grants: GrantSettings = Field(default_factory=GrantSettings)
    history: HistorySettings = Field(default_factory=HistorySettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    openai: OpenAISettings = Field(default_factory=OpenAISettings)
    mcp: McpSettings = Field(default_factory=McpSettings)
    page: PageSettings = Field(default_factory=PageSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, _OwnFieldsEnv(settings_cls), dotenv_settings, file_secret_settings

    @model_validator(mode="before")
    @classmethod
    def _sections_from_keywords(cls, data: Any) -> Any:
        """A section given as a dict is built like its default (unset fields from the environment);
        an old flat keyword is refused with where it lives now."""
        if not isinstance(data, dict):
            return data
        moved = [key for key in data if key in _MOVED and key not in cls.model_fields]
        if moved:
            raise ValueError(
                "settings are grouped in sections: "
                + ", ".join(f"{key} is now {_MOVED[key]}" for key in moved)
                + " (environment variable names are unchanged)"
            )
        return {
            key: _SECTIONS[key](**value) if key in _SECTIONS and isinstance(value, dict) else value
            for key, value in data.items()
        }

    @classmethod
    def env_names(cls) -> dict[str, str]:
        """Every environment variable Settings reads -> the field it sets ("RAGSERVE_HOST" -> "transport.host")."""
        own = {_env_name(cls, field): field for field in cls.model_fields if field not in _SECTIONS}
        return {**_SECTION_ENV, **own}

    @model_validator(mode="after")
    def _mcp_needs_the_http_listener(self) -> Self:
        if self.mcp.enabled and not self.http.port:
            raise ValueError("RAGSERVE_MCP_ENABLED serves /mcp on the HTTP listener: set RAGSERVE_HTTP_PORT too")
        if self.page.enabled and not self.http.port:
            raise ValueError("RAGSERVE_PAGE_ENABLED serves /ui/ on the HTTP listener: set RAGSERVE_HTTP_PORT too")
        return self

    @model_validator(mode="after")
    def _streams_cover_calls(self) -> Self:
        needed = self.limits.max_in_flight + self.limits.max_side_streams
        if self.transport.max_concurrent_streams < needed:
            raise ValueError(
                f"RAGSERVE_MAX_CONCURRENT_STREAMS ({self.transport.max_concurrent_streams}) must be at least "
                f"RAGSERVE_MAX_IN_FLIGHT + RAGSERVE_MAX_SIDE_STREAMS ({needed}): "
                "else calls over one channel queue in the client instead of being refused"
            )
        return self
