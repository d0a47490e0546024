from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RequestClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REQUEST_CLASS_UNSPECIFIED: _ClassVar[RequestClass]
    REQUEST_CLASS_INTERACTIVE: _ClassVar[RequestClass]
    REQUEST_CLASS_BATCH: _ClassVar[RequestClass]
REQUEST_CLASS_UNSPECIFIED: RequestClass
REQUEST_CLASS_INTERACTIVE: RequestClass
REQUEST_CLASS_BATCH: RequestClass

class RetrieveRequest(_message.Message):
    __slots__ = ("query", "top_k", "budget_ms", "dedupe_documents", "request_class", "answer_span", "filter")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    BUDGET_MS_FIELD_NUMBER: _ClassVar[int]
    DEDUPE_DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_CLASS_FIELD_NUMBER: _ClassVar[int]
    ANSWER_SPAN_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    query: str
    top_k: int
    budget_ms: int
    dedupe_documents: bool
    request_class: RequestClass
    answer_span: bool
    filter: Filter
    def __init__(self, query: _Optional[str] = ..., top_k: _Optional[int] = ..., budget_ms: _Optional[int] = ..., dedupe_documents: _Optional[bool] = ..., request_class: _Optional[_Union[RequestClass, str]] = ..., answer_span: _Optional[bool] = ..., filter: _Optional[_Union[Filter, _Mapping]] = ...) -> None: ...

class Filter(_message.Message):
    __slots__ = ("must", "should", "must_not")
    MUST_FIELD_NUMBER: _ClassVar[int]
    SHOULD_FIELD_NUMBER: _ClassVar[int]
    MUST_NOT_FIELD_NUMBER: _ClassVar[int]
    must: _containers.RepeatedCompositeFieldContainer[Condition]
    should: _containers.RepeatedCompositeFieldContainer[Condition]
    must_not: _containers.RepeatedCompositeFieldContainer[Condition]
    def __init__(self, must: _Optional[_Iterable[_Union[Condition, _Mapping]]] = ..., should: _Optional[_Iterable[_Union[Condition, _Mapping]]] = ..., must_not: _Optional[_Iterable[_Union[Condition, _Mapping]]] = ...) -> None: ...

class Condition(_message.Message):
    __slots__ = ("key", "match", "range", "exists", "filter")
    KEY_FIELD_NUMBER: _ClassVar[int]
    MATCH_FIELD_NUMBER: _ClassVar[int]
    RANGE_FIELD_NUMBER: _ClassVar[int]
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    key: str
    match: Match
    range: Range
    exists: bool
    filter: Filter
    def __init__(self, key: _Optional[str] = ..., match: _Optional[_Union[Match, _Mapping]] = ..., range: _Optional[_Union[Range, _Mapping]] = ..., exists: _Optional[bool] = ..., filter: _Optional[_Union[Filter, _Mapping]] = ...) -> None: ...

class Match(_message.Message):
    __slots__ = ("value", "any")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    ANY_FIELD_NUMBER: _ClassVar[int]
    value: _struct_pb2.Value
    any: _struct_pb2.ListValue
    def __init__(self, value: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., any: _Optional[_Union[_struct_pb2.ListValue, _Mapping]] = ...) -> None: ...

class Range(_message.Message):
    __slots__ = ("gt", "gte", "lt", "lte")
    GT_FIELD_NUMBER: _ClassVar[int]
    GTE_FIELD_NUMBER: _ClassVar[int]
    LT_FIELD_NUMBER: _ClassVar[int]
    LTE_FIELD_NUMBER: _ClassVar[int]
    gt: _struct_pb2.Value
    gte: _struct_pb2.Value
    lt: _struct_pb2.Value
    lte: _struct_pb2.Value
    def __init__(self, gt: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., gte: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., lt: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., lte: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...

class Passage(_message.Message):
    __slots__ = ("doc_id", "chunk_id", "text", "score", "title", "rank", "highlight", "location")
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    HIGHLIGHT_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    doc_id: str
    chunk_id: str
    text: str
    score: float
    title: str
    rank: int
    highlight: Highlight
    location: SourceLocation
    def __init__(self, doc_id: _Optional[str] = ..., chunk_id: _Optional[str] = ..., text: _Optional[str] = ..., score: _Optional[float] = ..., title: _Optional[str] = ..., rank: _Optional[int] = ..., highlight: _Optional[_Union[Highlight, _Mapping]] = ..., location: _Optional[_Union[SourceLocation, _Mapping]] = ...) -> None: ...

class SourceLocation(_message.Message):
    __slots__ = ("locator", "page", "page_start", "section", "start", "end")
    LOCATOR_FIELD_NUMBER: _ClassVar[int]
    PAGE_FIELD_NUMBER: _ClassVar[int]
    PAGE_START_FIELD_NUMBER: _ClassVar[int]
    SECTION_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    locator: str
    page: int
    page_start: int
    section: _containers.RepeatedScalarFieldContainer[str]
    start: int
    end: int
    def __init__(self, locator: _Optional[str] = ..., page: _Optional[int] = ..., page_start: _Optional[int] = ..., section: _Optional[_Iterable[str]] = ..., start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class Highlight(_message.Message):
    __slots__ = ("start", "end", "coverage")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    COVERAGE_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    coverage: float
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ..., coverage: _Optional[float] = ...) -> None: ...

class AnswerSpan(_message.Message):
    __slots__ = ("passage", "start", "end", "text", "margin", "answers", "sentence_start", "sentence_end")
    PASSAGE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MARGIN_FIELD_NUMBER: _ClassVar[int]
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    SENTENCE_START_FIELD_NUMBER: _ClassVar[int]
    SENTENCE_END_FIELD_NUMBER: _ClassVar[int]
    passage: int
    start: int
    end: int
    text: str
    margin: float
    answers: bool
    sentence_start: int
    sentence_end: int
    def __init__(self, passage: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., text: _Optional[str] = ..., margin: _Optional[float] = ..., answers: _Optional[bool] = ..., sentence_start: _Optional[int] = ..., sentence_end: _Optional[int] = ...) -> None: ...

class Support(_message.Message):
    __slots__ = ("coverage", "low", "evidence_passage")
    COVERAGE_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_PASSAGE_FIELD_NUMBER: _ClassVar[int]
    coverage: float
    low: bool
    evidence_passage: int
    def __init__(self, coverage: _Optional[float] = ..., low: _Optional[bool] = ..., evidence_passage: _Optional[int] = ...) -> None: ...

class StageTimings(_message.Message):
    __slots__ = ("embed_ms", "search_ms", "rerank_ms", "retrieval_total_ms", "prompt_ms", "ttft_ms", "generation_ms", "total_ms", "time_per_output_token_ms", "cache_ms", "answer_cache_ms", "context_ms", "evidence_ms", "engine_wait_ms", "reader_ms")
    EMBED_MS_FIELD_NUMBER: _ClassVar[int]
    SEARCH_MS_FIELD_NUMBER: _ClassVar[int]
    RERANK_MS_FIELD_NUMBER: _ClassVar[int]
    RETRIEVAL_TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_MS_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    TIME_PER_OUTPUT_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    CACHE_MS_FIELD_NUMBER: _ClassVar[int]
    ANSWER_CACHE_MS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_MS_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_MS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    READER_MS_FIELD_NUMBER: _ClassVar[int]
    embed_ms: float
    search_ms: float
    rerank_ms: float
    retrieval_total_ms: float
    prompt_ms: float
    ttft_ms: float
    generation_ms: float
    total_ms: float
    time_per_output_token_ms: float
    cache_ms: float
    answer_cache_ms: float
    context_ms: float
    evidence_ms: float
    engine_wait_ms: float
    reader_ms: float
    def __init__(self, embed_ms: _Optional[float] = ..., search_ms: _Optional[float] = ..., rerank_ms: _Optional[float] = ..., retrieval_total_ms: _Optional[float] = ..., prompt_ms: _Optional[float] = ..., ttft_ms: _Optional[float] = ..., generation_ms: _Optional[float] = ..., total_ms: _Optional[float] = ..., time_per_output_token_ms: _Optional[float] = ..., cache_ms: _Optional[float] = ..., answer_cache_ms: _Optional[float] = ..., context_ms: _Optional[float] = ..., evidence_ms: _Optional[float] = ..., engine_wait_ms: _Optional[float] = ..., reader_ms: _Optional[float] = ...) -> None: ...

class DegradedFlags(_message.Message):
    __slots__ = ("budget_exhausted", "search_truncated", "rerank_skipped", "rerank_truncated", "notes")
    BUDGET_EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    SEARCH_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    RERANK_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    RERANK_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    budget_exhausted: bool
    search_truncated: bool
    rerank_skipped: bool
    rerank_truncated: bool
    notes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, budget_exhausted: _Optional[bool] = ..., search_truncated: _Optional[bool] = ..., rerank_skipped: _Optional[bool] = ..., rerank_truncated: _Optional[bool] = ..., notes: _Optional[_Iterable[str]] = ...) -> None: ...

class RetrieveResponse(_message.Message):
    __slots__ = ("passages", "timings", "degraded", "index_version", "rerank_tiers", "cache_hit", "support", "answer")
    PASSAGES_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    INDEX_VERSION_FIELD_NUMBER: _ClassVar[int]
    RERANK_TIERS_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_FIELD_NUMBER: _ClassVar[int]
    SUPPORT_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    passages: _containers.RepeatedCompositeFieldContainer[Passage]
    timings: StageTimings
    degraded: DegradedFlags
    index_version: str
    rerank_tiers: _containers.RepeatedScalarFieldContainer[str]
    cache_hit: bool
    support: Support
    answer: AnswerSpan
    def __init__(self, passages: _Optional[_Iterable[_Union[Passage, _Mapping]]] = ..., timings: _Optional[_Union[StageTimings, _Mapping]] = ..., degraded: _Optional[_Union[DegradedFlags, _Mapping]] = ..., index_version: _Optional[str] = ..., rerank_tiers: _Optional[_Iterable[str]] = ..., cache_hit: _Optional[bool] = ..., support: _Optional[_Union[Support, _Mapping]] = ..., answer: _Optional[_Union[AnswerSpan, _Mapping]] = ...) -> None: ...

class QueryRequest(_message.Message):
    __slots__ = ("query", "top_k", "budget_ms", "max_tokens", "temperature", "dedupe_documents", "context_token_budget", "request_class", "filter", "history")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    BUDGET_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    DEDUPE_DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    REQUEST_CLASS_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    query: str
    top_k: int
    budget_ms: int
    max_tokens: int
    temperature: float
    dedupe_documents: bool
    context_token_budget: int
    request_class: RequestClass
    filter: Filter
    history: _containers.RepeatedCompositeFieldContainer[Turn]
    def __init__(self, query: _Optional[str] = ..., top_k: _Optional[int] = ..., budget_ms: _Optional[int] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., dedupe_documents: _Optional[bool] = ..., context_token_budget: _Optional[int] = ..., request_class: _Optional[_Union[RequestClass, str]] = ..., filter: _Optional[_Union[Filter, _Mapping]] = ..., history: _Optional[_Iterable[_Union[Turn, _Mapping]]] = ...) -> None: ...

class Turn(_message.Message):
    __slots__ = ("role", "text")
    class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ROLE_UNSPECIFIED: _ClassVar[Turn.Role]
        ROLE_USER: _ClassVar[Turn.Role]
        ROLE_ASSISTANT: _ClassVar[Turn.Role]
    ROLE_UNSPECIFIED: Turn.Role
    ROLE_USER: Turn.Role
    ROLE_ASSISTANT: Turn.Role
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    role: Turn.Role
    text: str
    def __init__(self, role: _Optional[_Union[Turn.Role, str]] = ..., text: _Optional[str] = ...) -> None: ...

class RetrievalEvent(_message.Message):
    __slots__ = ("passages", "timings", "degraded", "index_version", "rerank_tiers", "cache_hit", "support", "answer")
    PASSAGES_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    INDEX_VERSION_FIELD_NUMBER: _ClassVar[int]
    RERANK_TIERS_FIELD_NUMBER: _ClassVar[int]
    CACHE_HIT_FIELD_NUMBER: _ClassVar[int]
    SUPPORT_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    passages: _containers.RepeatedCompositeFieldContainer[Passage]
    timings: StageTimings
    degraded: DegradedFlags
    index_version: str
    rerank_tiers: _containers.RepeatedScalarFieldContainer[str]
    cache_hit: bool
    support: Support
    answer: AnswerSpan
    def __init__(self, passages: _Optional[_Iterable[_Union[Passage, _Mapping]]] = ..., timings: _Optional[_Union[StageTimings, _Mapping]] = ..., degraded: _Optional[_Union[DegradedFlags, _Mapping]] = ..., index_version: _Optional[str] = ..., rerank_tiers: _Optional[_Iterable[str]] = ..., cache_hit: _Optional[bool] = ..., support: _Optional[_Union[Support, _Mapping]] = ..., answer: _Optional[_Union[AnswerSpan, _Mapping]] = ...) -> None: ...

class AnswerEvent(_message.Message):
    __slots__ = ("answer", "reader_ms")
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    READER_MS_FIELD_NUMBER: _ClassVar[int]
    answer: AnswerSpan
    reader_ms: float
    def __init__(self, answer: _Optional[_Union[AnswerSpan, _Mapping]] = ..., reader_ms: _Optional[float] = ...) -> None: ...

class TokenEvent(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "prefix_cache_hit_tokens", "context_tokens", "context_tokens_full", "draft_tokens", "accepted_draft_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_TOKENS_FULL_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    prefix_cache_hit_tokens: int
    context_tokens: int
    context_tokens_full: int
    draft_tokens: int
    accepted_draft_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., prefix_cache_hit_tokens: _Optional[int] = ..., context_tokens: _Optional[int] = ..., context_tokens_full: _Optional[int] = ..., draft_tokens: _Optional[int] = ..., accepted_draft_tokens: _Optional[int] = ...) -> None: ...

class FinalEvent(_message.Message):
    __slots__ = ("usage", "timings", "degraded", "finish_reason", "generator_model", "answer_cache_hit", "request_class", "declined", "decline_evidence", "citations", "unsupported")
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    GENERATOR_MODEL_FIELD_NUMBER: _ClassVar[int]
    ANSWER_CACHE_HIT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_CLASS_FIELD_NUMBER: _ClassVar[int]
    DECLINED_FIELD_NUMBER: _ClassVar[int]
    DECLINE_EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    CITATIONS_FIELD_NUMBER: _ClassVar[int]
    UNSUPPORTED_FIELD_NUMBER: _ClassVar[int]
    usage: Usage
    timings: StageTimings
    degraded: DegradedFlags
    finish_reason: str
    generator_model: str
    answer_cache_hit: bool
    request_class: RequestClass
    declined: bool
    decline_evidence: DeclineEvidence
    citations: _containers.RepeatedCompositeFieldContainer[Citation]
    unsupported: bool
    def __init__(self, usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[StageTimings, _Mapping]] = ..., degraded: _Optional[_Union[DegradedFlags, _Mapping]] = ..., finish_reason: _Optional[str] = ..., generator_model: _Optional[str] = ..., answer_cache_hit: _Optional[bool] = ..., request_class: _Optional[_Union[RequestClass, str]] = ..., declined: _Optional[bool] = ..., decline_evidence: _Optional[_Union[DeclineEvidence, _Mapping]] = ..., citations: _Optional[_Iterable[_Union[Citation, _Mapping]]] = ..., unsupported: _Optional[bool] = ...) -> None: ...

class Citation(_message.Message):
    __slots__ = ("marker", "answer_start", "answer_end", "passage", "doc_id", "chunk_id", "location", "quote", "quote_start", "quote_end", "supported")
    MARKER_FIELD_NUMBER: _ClassVar[int]
    ANSWER_START_FIELD_NUMBER: _ClassVar[int]
    ANSWER_END_FIELD_NUMBER: _ClassVar[int]
    PASSAGE_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    QUOTE_FIELD_NUMBER: _ClassVar[int]
    QUOTE_START_FIELD_NUMBER: _ClassVar[int]
    QUOTE_END_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    marker: int
    answer_start: int
    answer_end: int
    passage: int
    doc_id: str
    chunk_id: str
    location: SourceLocation
    quote: str
    quote_start: int
    quote_end: int
    supported: bool
    def __init__(self, marker: _Optional[int] = ..., answer_start: _Optional[int] = ..., answer_end: _Optional[int] = ..., passage: _Optional[int] = ..., doc_id: _Optional[str] = ..., chunk_id: _Optional[str] = ..., location: _Optional[_Union[SourceLocation, _Mapping]] = ..., quote: _Optional[str] = ..., quote_start: _Optional[int] = ..., quote_end: _Optional[int] = ..., supported: _Optional[bool] = ...) -> None: ...

class DeclineEvidence(_message.Message):
    __slots__ = ("score", "threshold", "signals")
    class SignalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SCORE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    SIGNALS_FIELD_NUMBER: _ClassVar[int]
    score: float
    threshold: float
    signals: _containers.ScalarMap[str, float]
    def __init__(self, score: _Optional[float] = ..., threshold: _Optional[float] = ..., signals: _Optional[_Mapping[str, float]] = ...) -> None: ...

class QueryEvent(_message.Message):
    __slots__ = ("retrieval", "token", "final", "answer", "citation")
    RETRIEVAL_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    CITATION_FIELD_NUMBER: _ClassVar[int]
    retrieval: RetrievalEvent
    token: TokenEvent
    final: FinalEvent
    answer: AnswerEvent
    citation: Citation
    def __init__(self, retrieval: _Optional[_Union[RetrievalEvent, _Mapping]] = ..., token: _Optional[_Union[TokenEvent, _Mapping]] = ..., final: _Optional[_Union[FinalEvent, _Mapping]] = ..., answer: _Optional[_Union[AnswerEvent, _Mapping]] = ..., citation: _Optional[_Union[Citation, _Mapping]] = ...) -> None: ...

class SourceRequest(_message.Message):
    __slots__ = ("chunk_id", "start", "end", "context_chars")
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_CHARS_FIELD_NUMBER: _ClassVar[int]
    chunk_id: str
    start: int
    end: int
    context_chars: int
    def __init__(self, chunk_id: _Optional[str] = ..., start: _Optional[int] = ..., end: _Optional[int] = ..., context_chars: _Optional[int] = ...) -> None: ...

class SourceResponse(_message.Message):
    __slots__ = ("found", "doc_id", "title", "location", "text", "text_start", "quote_start", "quote_end", "index_version")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    DOC_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TEXT_START_FIELD_NUMBER: _ClassVar[int]
    QUOTE_START_FIELD_NUMBER: _ClassVar[int]
    QUOTE_END_FIELD_NUMBER: _ClassVar[int]
    INDEX_VERSION_FIELD_NUMBER: _ClassVar[int]
    found: bool
    doc_id: str
    title: str
    location: SourceLocation
    text: str
    text_start: int
    quote_start: int
    quote_end: int
    index_version: str
    def __init__(self, found: _Optional[bool] = ..., doc_id: _Optional[str] = ..., title: _Optional[str] = ..., location: _Optional[_Union[SourceLocation, _Mapping]] = ..., text: _Optional[str] = ..., text_start: _Optional[int] = ..., quote_start: _Optional[int] = ..., quote_end: _Optional[int] = ..., index_version: _Optional[str] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("index_version", "index_chunks", "embedder_model", "generator_model", "rerank_tiers", "retrieval_budget_ms", "generator_unfinished_requests", "requests_in_flight", "generator_settings", "host_cpu", "generator_servers", "generator_pace", "host_share", "warming", "reader_model", "reader_threshold", "index_served_s", "last_reload_refusal")
    INDEX_VERSION_FIELD_NUMBER: _ClassVar[int]
    INDEX_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDER_MODEL_FIELD_NUMBER: _ClassVar[int]
    GENERATOR_MODEL_FIELD_NUMBER: _ClassVar[int]
    RERANK_TIERS_FIELD_NUMBER: _ClassVar[int]
    RETRIEVAL_BUDGET_MS_FIELD_NUMBER: _ClassVar[int]
    GENERATOR_UNFINISHED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    GENERATOR_SETTINGS_FIELD_NUMBER: _ClassVar[int]
    HOST_CPU_FIELD_NUMBER: _ClassVar[int]
    GENERATOR_SERVERS_FIELD_NUMBER: _ClassVar[int]
    GENERATOR_PACE_FIELD_NUMBER: _ClassVar[int]
    HOST_SHARE_FIELD_NUMBER: _ClassVar[int]
    WARMING_FIELD_NUMBER: _ClassVar[int]
    READER_MODEL_FIELD_NUMBER: _ClassVar[int]
    READER_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    INDEX_SERVED_S_FIELD_NUMBER: _ClassVar[int]
    LAST_RELOAD_REFUSAL_FIELD_NUMBER: _ClassVar[int]
    index_version: str
    index_chunks: int
    embedder_model: str
    generator_model: str
    rerank_tiers: _containers.RepeatedScalarFieldContainer[str]
    retrieval_budget_ms: int
    generator_unfinished_requests: int
    requests_in_flight: int
    generator_settings: _containers.RepeatedCompositeFieldContainer[EngineSetting]
    host_cpu: str
    generator_servers: _containers.RepeatedCompositeFieldContainer[GeneratorServer]
    generator_pace: str
    host_share: HostShare
    warming: Warming
    reader_model: str
    reader_threshold: float
    index_served_s: float
    last_reload_refusal: str
    def __init__(self, index_version: _Optional[str] = ..., index_chunks: _Optional[int] = ..., embedder_model: _Optional[str] = ..., generator_model: _Optional[str] = ..., rerank_tiers: _Optional[_Iterable[str]] = ..., retrieval_budget_ms: _Optional[int] = ..., generator_unfinished_requests: _Optional[int] = ..., requests_in_flight: _Optional[int] = ..., generator_settings: _Optional[_Iterable[_Union[EngineSetting, _Mapping]]] = ..., host_cpu: _Optional[str] = ..., generator_servers: _Optional[_Iterable[_Union[GeneratorServer, _Mapping]]] = ..., generator_pace: _Optional[str] = ..., host_share: _Optional[_Union[HostShare, _Mapping]] = ..., warming: _Optional[_Union[Warming, _Mapping]] = ..., reader_model: _Optional[str] = ..., reader_threshold: _Optional[float] = ..., index_served_s: _Optional[float] = ..., last_reload_refusal: _Optional[str] = ...) -> None: ...

class Warming(_message.Message):
    __slots__ = ("passages", "tokens", "left_out", "done", "seconds", "planned")
    PASSAGES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    LEFT_OUT_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    PLANNED_FIELD_NUMBER: _ClassVar[int]
    passages: int
    tokens: int
    left_out: int
    done: bool
    seconds: float
    planned: int
    def __init__(self, passages: _Optional[int] = ..., tokens: _Optional[int] = ..., left_out: _Optional[int] = ..., done: _Optional[bool] = ..., seconds: _Optional[float] = ..., planned: _Optional[int] = ...) -> None: ...

class HostShare(_message.Message):
    __slots__ = ("usable_cpus", "neighbour_cpus", "engine_threads", "adaptive")
    USABLE_CPUS_FIELD_NUMBER: _ClassVar[int]
    NEIGHBOUR_CPUS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_THREADS_FIELD_NUMBER: _ClassVar[int]
    ADAPTIVE_FIELD_NUMBER: _ClassVar[int]
    usable_cpus: int
    neighbour_cpus: float
    engine_threads: int
    adaptive: bool
    def __init__(self, usable_cpus: _Optional[int] = ..., neighbour_cpus: _Optional[float] = ..., engine_threads: _Optional[int] = ..., adaptive: _Optional[bool] = ...) -> None: ...

class GeneratorServer(_message.Message):
    __slots__ = ("url", "up", "in_flight")
    URL_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    url: str
    up: bool
    in_flight: int
    def __init__(self, url: _Optional[str] = ..., up: _Optional[bool] = ..., in_flight: _Optional[int] = ...) -> None: ...

class EngineSetting(_message.Message):
    __slots__ = ("name", "value", "reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    reason: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...
