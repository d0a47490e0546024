"""The cache keys are built from the whole retrieval request: a field added to RetrieveParams is in
the key unless it is named as not changing the result (and this test says why for each)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ragserve.filters import Filter, Match
from ragserve.request.caches import NOT_IN_SCOPE, CacheScope, PipelineCaches
from ragserve.types import RetrieveParams

# Why each field is outside the scope: the budget bounds the work, not the answer (a result cut
# short is never stored); the query is the key's own part (normalized), so the semantic cache can
# compare questions of one scope.
EXPECTED_OUTSIDE = {"budget_ms", "query"}

_OTHER: dict[str, Any] = {
    "top_k": 7,
    "dedupe_documents": True,
    "filter": Filter(must=(Match("lang", ("de",)),)),
    "grant": Filter(must=(Match("groups", ("public", "eng"), any=True),)),
    "recent": ("What is the Bank of Sydney?",),
    "question_weight": 0.5,
}


def _caches() -> PipelineCaches:
    scope = CacheScope("embedder", ("ef=64",), ("dedupe=0", "dedupe=1"), "gen", "prompt")
    return PipelineCaches(scope, passages=None, answers=None)


def test_only_the_named_fields_stay_out_of_the_key() -> None:
    assert NOT_IN_SCOPE == EXPECTED_OUTSIDE


def test_every_other_field_changes_the_key() -> None:
    caches = _caches()
    base = RetrieveParams("what is a bloom filter", 5, 70)
    key = caches.retrieval_key(base, "1", "ident")
    names = {f.name for f in dataclasses.fields(RetrieveParams)} - NOT_IN_SCOPE
    # A field added without a value here fails: say what a different value of it is.
    assert names == set(_OTHER), f"give a changed value for {sorted(names - set(_OTHER))} in _OTHER"
    for name, value in _OTHER.items():
        changed = caches.retrieval_key(dataclasses.replace(base, **{name: value}), "1", "ident")
        assert changed.scope != key.scope, name
        assert changed.storage_key != key.storage_key, name


def test_the_budget_does_not_change_the_key_and_grants_keep_callers_apart() -> None:
    caches = _caches()
    base = RetrieveParams("q", 5, 70, grant=_OTHER["grant"])
    assert caches.retrieval_key(base, "1", "i") == caches.retrieval_key(
        dataclasses.replace(base, budget_ms=10), "1", "i"
    )
    other = dataclasses.replace(base, grant=Filter(must=(Match("groups", ("public",), any=True),)))
    assert caches.retrieval_key(base, "1", "i").scope != caches.retrieval_key(other, "1", "i").scope
    assert (
        caches.retrieval_key(dataclasses.replace(base, grant=None), "1", "i").scope
        != caches.retrieval_key(base, "1", "i").scope
    )
