from __future__ import annotations

from pathlib import Path

import pytest

from tests.rerank.models import build_test_model


@pytest.fixture(scope="session")
def test_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Random-head BERT models with the MiniLM-L2 and -L6 shapes (mechanics and cost only)."""
    root = tmp_path_factory.mktemp("rerank-models")
    return {"l2": build_test_model(root / "l2", 2), "l6": build_test_model(root / "l6", 6)}
