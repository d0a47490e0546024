"""The filter language: what is refused (and named), and what a filter means."""

from __future__ import annotations

import pytest

from ragserve.errors import InvalidArgument
from ragserve.filters import Exists, Filter, FilterLimits, Match, Range, canonical, matches, parse_filter

SCHEMA = {"lang": "keyword", "year": "integer", "score": "float", "draft": "bool", "published": "datetime"}


def refused(raw: object, limits: FilterLimits | None = None) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as caught:
        parse_filter(raw, SCHEMA, limits)
    return caught.value


def test_a_filter_in_qdrants_shape_parses_into_its_meaning() -> None:
    raw = {
        "must": [{"key": "lang", "match": {"value": "en"}}, {"key": "year", "range": {"gte": 2020, "lt": 2024.0}}],
        "should": [{"key": "draft", "match": {"value": False}}, {"key": "score", "exists": True}],
        "must_not": [{"filter": {"must": [{"key": "published", "range": {"lt": "2021-01-01"}}]}}],
    }
    flt = parse_filter(raw, SCHEMA)
    assert flt == Filter(
        must=(Match("lang", ("en",)), Range("year", gte=2020.0, lt=2024.0)),
        should=(Match("draft", (False,)), Exists("score")),
        must_not=(Filter(must=(Range("published", lt=1609459200.0),)),),
    )


@pytest.mark.parametrize(
    ("raw", "field", "words"),
    [
        ({"must": [{"key": "colour", "match": {"value": "red"}}]}, "filter.must[0].key", "not a filterable field"),
        ({"must": [{"key": "year", "match": {"value": "twenty"}}]}, "filter.must[0].match.value", "integer"),
        ({"must": [{"key": "year", "match": {"value": 20.5}}]}, "filter.must[0].match.value", "not an integer"),
        ({"should": [{"key": "draft", "match": {"value": 1}}]}, "filter.should[0].match.value", "true or false"),
        ({"must": [{"key": "lang", "range": {"gt": 1}}]}, "filter.must[0].range", "ranges apply"),
        ({"must": [{"key": "published", "range": {"gt": "yesterday"}}]}, "filter.must[0].range.gt", "datetime"),
        ({"must": [{"key": "lang", "match": {"any": []}}]}, "filter.must[0].match.any", "non-empty"),
        ({"must": [{"key": "lang"}]}, "filter.must[0]", "exactly one of"),
        ({"must": [{"key": "lang", "match": {"value": "x"}, "exists": True}]}, "filter.must[0]", "exactly one of"),
        ({"must": {"key": "lang"}}, "filter.must", "list"),
        ({"maybe": []}, "filter.maybe", "not part of a filter"),
        ({"must": [{"key": "lang", "match": {"value": "x" * 600}}]}, "filter.must[0].match.value", "keyword"),
    ],
)
def test_bad_filters_are_refused_naming_the_field(raw: object, field: str, words: str) -> None:
    error = refused(raw)
    assert error.field == field
    assert words in error.description


def test_limits_bound_conditions_depth_and_values() -> None:
    limits = FilterLimits(max_conditions=3, max_depth=2, max_values=2)
    many = {"must": [{"key": "lang", "match": {"value": str(i)}} for i in range(4)]}
    assert refused(many, limits).field == "filter.must[3]"
    deep = {"must": [{"filter": {"must": [{"filter": {"must": []}}]}}]}
    assert refused(deep, limits).field == "filter.must[0].filter.must[0].filter"
    assert "RAGSERVE_FILTER_MAX_DEPTH" in refused(deep, limits).description
    wide = {"must": [{"key": "lang", "match": {"any": ["a", "b", "c"]}}]}
    assert refused(wide, limits).field == "filter.must[0].match.any"


def test_no_filter_and_an_empty_one_mean_the_whole_corpus() -> None:
    assert parse_filter(None, SCHEMA) is None
    assert parse_filter({}, SCHEMA) is None
    assert parse_filter({"must": [], "should": []}, SCHEMA) is None


def test_meaning_follows_qdrant_multi_valued_fields_included() -> None:
    schema = {"groups": "keyword", "year": "integer", "flag": "bool"}
    doc = {"groups": ["eng", "ops"], "year": 2021, "flag": True}
    assert matches(parse_filter({"must": [{"key": "groups", "match": {"value": "ops"}}]}, schema), doc, schema)
    assert matches(parse_filter({"must": [{"key": "groups", "match": {"any": ["hr", "eng"]}}]}, schema), doc, schema)
    assert not matches(parse_filter({"must_not": [{"key": "groups", "match": {"value": "eng"}}]}, schema), doc, schema)
    assert matches(parse_filter({"must_not": [{"key": "groups", "match": {"value": "hr"}}]}, schema), doc, schema)
    # should: at least one; a missing field fails a match and passes a must_not.
    either = {"should": [{"key": "year", "range": {"lt": 2000}}, {"key": "groups", "exists": True}]}
    assert matches(parse_filter(either, schema), doc, schema)
    assert not matches(parse_filter(either, schema), {"year": 2021}, schema)
    assert matches(parse_filter({"must_not": [{"key": "groups", "exists": True}]}, schema), {}, schema)
    # true is not 1: a bool field never matches an integer and the other way round.
    assert not matches(Filter(must=(Match("flag", (1,)),)), doc, schema)


def test_equal_filters_have_one_canonical_form_for_cache_keys() -> None:
    a = parse_filter({"must": [{"key": "lang", "match": {"any": ["de", "en"]}}]}, SCHEMA)
    b = parse_filter({"must": [{"key": "lang", "match": {"any": ["en", "de", "en"]}}]}, SCHEMA)
    assert canonical(a) == canonical(b)
    c = parse_filter({"must": [{"key": "year", "match": {"value": 2020}}]}, SCHEMA)
    d = parse_filter({"must": [{"key": "year", "match": {"value": 2021}}]}, SCHEMA)
    assert canonical(c) != canonical(d)
    dt1 = parse_filter({"must": [{"key": "published", "match": {"value": "2024-01-01"}}]}, SCHEMA)
    dt2 = parse_filter({"must": [{"key": "published", "match": {"value": "2024-01-01T00:00:00Z"}}]}, SCHEMA)
    assert canonical(dt1) == canonical(dt2)
