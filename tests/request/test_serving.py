"""The serving version's clock and refusals: what Info and the metrics tell an operator whose corpus
stopped updating."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ragserve import metrics
from ragserve.request.serving import VersionSource


def _serving(index: Any) -> Any:
    return SimpleNamespace(index=index, warm_up=lambda: None)


def test_a_swap_restarts_the_clock_and_a_refusal_is_kept_and_counted() -> None:
    versions = VersionSource(SimpleNamespace(version="1"), _serving)  # type: ignore[arg-type]
    started = versions.served_since
    assert versions.last_refusal == "" and metrics.INDEX_SERVED_SINCE._value.get() == started
    refused_before = metrics.INDEX_RELOADS_REFUSED._value.get()
    versions.refused("v000002: manifest checksum mismatch")
    assert versions.last_refusal == "v000002: manifest checksum mismatch" and versions.last_refusal_at >= started
    assert metrics.INDEX_RELOADS_REFUSED._value.get() == refused_before + 1
    assert metrics.INDEX_LAST_REFUSAL._value.get() == versions.last_refusal_at
    versions.swap(SimpleNamespace(version="3"))  # type: ignore[arg-type]
    assert versions.current.index.version == "3" and versions.served_since >= started
    assert metrics.INDEX_SERVED_SINCE._value.get() == versions.served_since
