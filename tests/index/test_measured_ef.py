"""A version's manifest asks for a search breadth; what it may ask is bounded."""

from __future__ import annotations

import pytest

from ragserve.factory.versions import MAX_MEASURED_EF, measured_ef


@pytest.mark.parametrize(
    ("hnsw", "used"),
    [
        ({}, 0),
        ({"ef_search": 96}, 96),
        ({"ef_search": 10**9}, MAX_MEASURED_EF),
        ({"ef_search": -5}, 0),
        ({"ef_search": "many"}, 0),
        ({"ef_search": True}, 0),
    ],
)
def test_the_manifests_breadth_is_a_count_within_its_bound(hnsw: dict[str, object], used: int) -> None:
    assert measured_ef(hnsw, "v000001") == used
