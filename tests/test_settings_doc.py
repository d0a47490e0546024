"""docs/settings.md is generated from the settings classes and must match them."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from ragserve.client import ClientSettings
from ragserve.config import FORMER_NAMES, Settings

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "settings_doc.py"
PAGE = REPO / "docs" / "settings.md"
REGENERATE = "python scripts/settings_doc.py > docs/settings.md"


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("settings_doc", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_settings_page_is_current(generator: ModuleType) -> None:
    assert PAGE.exists(), f"docs/settings.md is missing: run `{REGENERATE}`"
    assert PAGE.read_text(encoding="utf-8") == generator.render(), f"docs/settings.md is stale: run `{REGENERATE}`"


def test_check_mode_agrees(generator: ModuleType) -> None:
    assert generator.main(["--check"]) == 0, f"docs/settings.md is stale: run `{REGENERATE}`"


def test_every_variable_is_on_the_page() -> None:
    names = set(Settings.env_names()) | {f"RAGSERVE_CLIENT_{field.upper()}" for field in ClientSettings.model_fields}
    text = PAGE.read_text(encoding="utf-8")
    missing = sorted(name for name in names if f"`{name}`" not in text)
    assert not missing, f"docs/settings.md does not name {missing}: run `{REGENERATE}`"


def test_the_page_does_not_depend_on_this_machine(
    generator: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Defaults are the code's, never this environment's: another home, cache folder or variables
    give the same page."""
    expected = generator.render()
    monkeypatch.setenv("HOME", str(tmp_path / "someone"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("RAGSERVE_PORT", "1234")
    monkeypatch.setenv("RAGSERVE_AUTH_TOKEN", "not-on-the-page")
    page = generator.render()
    assert page == expected
    assert "not-on-the-page" not in page and "`~/.cache/ragserve/index/sample`" in page


def test_pages_name_only_variables_that_exist() -> None:
    """A variable named in the README or a docs page is one the settings page lists (a typo or a
    renamed setting in prose would otherwise go unnoticed)."""
    listed = set(re.findall(r"^\| `(RAGSERVE_[A-Z0-9_]+)`", PAGE.read_text(encoding="utf-8"), re.MULTILINE))
    listed |= set(FORMER_NAMES)  # still read, said on its new name's row
    unknown: dict[str, list[str]] = {}
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for name in set(re.findall(r"\bRAGSERVE_[A-Z0-9_]*[A-Z0-9]\b", page.read_text(encoding="utf-8"))):
            if name not in listed:
                unknown.setdefault(name, []).append(page.relative_to(REPO).as_posix())
    assert not unknown, f"pages name variables that no setting has: {unknown}"
