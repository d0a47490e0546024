"""The figures quoted in the docs are figures BENCHMARKS.md carries (scripts/check_figures.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_SPEC = importlib.util.spec_from_file_location("check_figures", REPO / "scripts" / "check_figures.py")
assert _SPEC is not None and _SPEC.loader is not None
figures = importlib.util.module_from_spec(_SPEC)
sys.modules["check_figures"] = figures  # dataclasses look their module up by name
_SPEC.loader.exec_module(figures)

BENCH = """
Prose: a hit took 0.082 ms, 779x faster; RSS 2,992 MiB.

| layout | RSS MiB | TTFT p50 |
|---|---|---|
| thread | 4,255 | **480** |
"""


def _unbacked(page_text: str, page: str = "docs/page.md") -> list[str]:
    with_unit, cells = figures.backing(BENCH)
    return [item.figure for item in figures.check_page(page, page_text, with_unit, cells)]


def test_every_quoted_figure_is_in_benchmarks() -> None:
    found, stale = figures.check()
    assert not found, "figures not in BENCHMARKS.md (scripts/check_figures.py):\n" + "\n".join(map(str, found))
    assert not stale, f"CONSTANTS entries that exempt nothing: {stale}"


def test_figures_match_with_their_unit_or_as_a_table_cell() -> None:
    assert _unbacked("hits in 0.082 ms (779x), 2992 MiB in one process, 4,255 MiB in four") == []
    assert _unbacked("TTFT p50 480 ms") == []  # a table cell: the unit is in the header
    assert _unbacked("a hit in 0.08 ms, 780x faster, 3 GiB") == ["0.08 ms", "780x", "3 GiB"]


def test_each_end_of_a_range_is_a_figure() -> None:
    assert _unbacked("between 480-500 ms") == ["500 ms"]


def test_settings_defaults_code_and_fenced_blocks_are_not_quoted_figures() -> None:
    page = """
Pings every `RAGSERVE_KEEPALIVE_TIME_MS` (30 s); logs say `decode 3.9x`.

```bash
sleep 12 s
```
"""
    assert _unbacked(page) == []


def test_constants_are_exempt_only_on_their_line() -> None:
    page = "the client pings every 30 s (ragserve.client)\nsomething else took 30 s"
    found = _unbacked(page, "docs/operations.md")
    assert found == ["30 s"]
