"""docs/operations.md documents every metric the server defines."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _defined_metrics() -> set[str]:
    """The metric names ragserve/metrics.py defines: the first argument of each Counter, Gauge or Histogram."""
    source = (REPO / "ragserve" / "metrics.py").read_text()
    return set(re.findall(r"\b(?:Counter|Gauge|Histogram)\(\s*\"(ragserve_[a-z0-9_]+)\"", source))


def test_the_source_defines_metrics() -> None:
    # The pattern above must keep finding them, or the next test would pass on nothing.
    from ragserve import metrics

    defined = _defined_metrics()
    objects = [m for m in vars(metrics).values() if type(m).__name__ in ("Counter", "Gauge", "Histogram")]
    assert len(defined) == len(objects) >= 30
    assert all(m._name in defined or f"{m._name}_total" in defined for m in objects)


def test_every_metric_is_documented_in_operations() -> None:
    page = (REPO / "docs" / "operations.md").read_text()
    listed = set(re.findall(r"^\| `(ragserve_[a-z0-9_]+)` \|", page, re.MULTILINE))
    missing = sorted(_defined_metrics() - listed)
    assert not missing, f"docs/operations.md, 'Every metric', does not list {missing}"
    unknown = sorted(listed - _defined_metrics())
    assert not unknown, f"docs/operations.md lists metrics the server does not define: {unknown}"
