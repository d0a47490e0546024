"""Check that the figures the docs quote are figures BENCHMARKS.md carries.

    python scripts/check_figures.py        # exit 1 and list each unbacked figure, else exit 0

The rule, narrow on purpose so that it is checkable and never flaky:

- **A figure** is a number (thousands commas and a decimal point allowed) followed by one of the
  units ms, s, MiB, GiB (with or without a space) or x (a ratio, written tight; also the
  multiplication sign): "425 ms", "2.2x", "2,992 MiB". In a range ("160-340 ms", "0.83-0.84x")
  each end is a figure with the unit.
  Percentages, counts and figures without a unit are not checked. Inline code (`...`) and fenced
  code blocks are not prose and are skipped: they hold commands, log lines and settings.
- **Backed**: BENCHMARKS.md holds the same number with the same unit ("425 ms", "425ms"), or the
  same number as a cell of a Markdown table row (tables give the unit in their header; "**506**"
  counts). Thousands commas are ignored on both sides.
- **Exempt**: a setting's default, written right after the setting's name in parentheses
  ("`RAGSERVE_KEEPALIVE_TIME_MS` (30 s)"); and the figures in `CONSTANTS` below, each with the
  reason it is not a measurement (a constant in the code, a test's bound, a deploy file's limit).

Checked: every page in docs/ (`PAGES`).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "BENCHMARKS.md"
PAGES = tuple(sorted(str(page.relative_to(REPO)) for page in (REPO / "docs").glob("*.md")))

# (page, figure as written, a phrase on the same line) -> why it is not a benchmark figure.
CONSTANTS: dict[tuple[str, str, str], str] = {
    ("docs/reranking.md", "30 s", "ratios older than"): "the rerank cost model's age limit (rerank/cost.py)",
    ("docs/operations.md", "0.5 s", "neighbour_cpus"): "the host share sampler's period (generate/host_share.py)",
    ("docs/operations.md", "1.5 s", "a thread comes back"): "3 samples 0.5 s apart (generate/host_share.py)",
    ("docs/operations.md", "3.9x", "generator_pace"): "an example of the log line's wording, not a claim",
    (
        "docs/operations.md",
        "200 ms",
        "DEADLINE_EXCEEDED",
    ): "a test's client deadline (tests/e2e/shared/test_hardening.py)",
    ("docs/operations.md", "1 s", "| 1 |"): "a test's bound (tests/e2e/shared/test_hardening.py)",
    ("docs/operations.md", "1 s", "| 2 |"): "a test's bound (tests/e2e/shared/test_hardening.py)",
    ("docs/operations.md", "250 ms", "| 3 |"): "a test's bound (tests/e2e/shared/test_hardening.py)",
    ("docs/operations.md", "8 MiB", "hot-passages.json"): "the counts file's size cap (request/hot.py)",
    ("docs/operations.md", "1 MiB", "/v1/models"): "a response cap (generate/vllm_wire.py)",
    ("docs/operations.md", "8 MiB", "/v1/models"): "a response cap (generate/vllm_wire.py)",
    ("docs/operations.md", "2 GiB", "retrieval only"): "a deploy file's memory limit, said to be an estimate",
    ("docs/operations.md", "30 s", "ragserve.client"): "the Python client's keepalive (client.py CHANNEL_OPTIONS)",
}

_TIMES = "\u00d7"  # the multiplication sign, a ratio like x
_UNIT = rf"(?P<unit>ms|s|x|{_TIMES}|MiB|GiB)"
# A space is allowed before ms, s, MiB, GiB; a ratio is written tight ("2.2x": "4 x 256" is a shape).
_SPACE = r"(?:\s(?=(?:ms|s|MiB|GiB)(?!\w)))?"
_NUMBER = r"\d[\d,]*(?:\.\d+)?"
# A number, or a range of two, then the unit; not part of a longer word or number.
_FIGURE = re.compile(rf"(?<![\w.,-])(?P<low>{_NUMBER})(?:\s?[-\u2013]\s?(?P<high>{_NUMBER}))?{_SPACE}{_UNIT}(?![\w])")
_CODE = re.compile(r"`[^`]*`")
_SETTING_DEFAULT = re.compile(r"`RAGSERVE_\w+`\s*\(([^)]*)\)")
_CELL_NUMBER = re.compile(rf"(?<![\w.,]){_NUMBER}(?![\w]|\.\d)")


@dataclass(frozen=True)
class Unbacked:
    page: str
    line: int
    figure: str
    text: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.figure!r} is not in BENCHMARKS.md: {self.text.strip()[:120]}"


def _plain(number: str) -> str:
    return number.replace(",", "")


def _unit(unit: str) -> str:
    return "x" if unit == _TIMES else unit


def backing(benchmarks: str) -> tuple[set[tuple[str, str]], set[str]]:
    """The (number, unit) pairs BENCHMARKS.md writes in prose or tables, and the numbers its tables hold."""
    with_unit: set[tuple[str, str]] = set()
    cells: set[str] = set()
    for line in benchmarks.splitlines():
        for match in _FIGURE.finditer(line):
            for number in (match["low"], match["high"]):
                if number:
                    with_unit.add((_plain(number), _unit(match["unit"])))
        if line.lstrip().startswith("|"):
            cells.update(_plain(m.group(0)) for m in _CELL_NUMBER.finditer(line.replace("*", "")))
    return with_unit, cells


def _prose(line: str) -> str:
    """The line with setting defaults and inline code blanked out (same length kept)."""
    line = _SETTING_DEFAULT.sub(lambda m: " " * len(m.group(0)), line)
    return _CODE.sub(lambda m: " " * len(m.group(0)), line)


def check_page(
    page: str,
    text: str,
    with_unit: set[tuple[str, str]],
    cells: set[str],
    used: set[tuple[str, str, str]] | None = None,
) -> list[Unbacked]:
    """The unbacked figures of one page; `used` collects the CONSTANTS entries that exempted one."""
    found: list[Unbacked] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for match in _FIGURE.finditer(_prose(line)):
            unit = _unit(match["unit"])
            for value in (match["low"], match["high"]):
                if not value:
                    continue
                figure = f"{value}{unit}" if unit == "x" else f"{value} {unit}"
                exempt = [key for key in CONSTANTS if key[:2] == (page, figure) and key[2] in line]
                if exempt:
                    if used is not None:
                        used.update(exempt)
                    continue
                if (_plain(value), unit) in with_unit or _plain(value) in cells:
                    continue
                found.append(Unbacked(page, number, figure, line))
    return found


def check(repo: Path = REPO) -> tuple[list[Unbacked], list[tuple[str, str, str]]]:
    """The unbacked figures of every page in PAGES, and the CONSTANTS entries nothing needs any more."""
    with_unit, cells = backing((repo / BENCHMARKS.name).read_text())
    found: list[Unbacked] = []
    used: set[tuple[str, str, str]] = set()
    for page in PAGES:
        found += check_page(page, (repo / page).read_text(), with_unit, cells, used)
    return found, sorted(set(CONSTANTS) - used)


def main() -> int:
    found, stale = check()
    for item in found:
        print(item)
    for key in stale:
        print(f"CONSTANTS entry {key} exempts nothing any more: remove it")
    if found:
        print(
            f"{len(found)} figure(s) not in BENCHMARKS.md: quote the benchmark's figure, reword, or (for a "
            "constant or a test's bound) add it to CONSTANTS in scripts/check_figures.py with the reason",
            file=sys.stderr,
        )
    return 1 if found or stale else 0


if __name__ == "__main__":
    sys.exit(main())
