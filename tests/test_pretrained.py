"""Model folders are opened without running their code and without reaching for a hub."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ragserve.pretrained import load_options


def test_local_folders_never_fall_back_to_a_hub_and_no_folder_runs_code(tmp_path: Path) -> None:
    assert load_options(tmp_path) == {"trust_remote_code": False, "local_files_only": True}
    assert load_options("./models/x")["local_files_only"]
    assert load_options("cross-encoder/ms-marco-MiniLM-L-6-v2") == {
        "trust_remote_code": False,
        "local_files_only": False,
    }


def test_the_reranker_and_the_generator_open_tokenizers_with_those_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers

    from ragserve.config import GeneratorSettings
    from ragserve.generate.vllm_engine import VllmGenerator
    from ragserve.rerank.cross_encoder import read_config

    seen: list[dict[str, Any]] = []

    class Recording:
        @staticmethod
        def from_pretrained(source: str, **kwargs: Any) -> Any:
            seen.append(kwargs)
            raise OSError("recorded")

    monkeypatch.setattr(transformers, "AutoConfig", Recording)
    monkeypatch.setattr(transformers, "AutoTokenizer", Recording)
    with pytest.raises(Exception, match="recorded"):
        read_config(str(tmp_path), "RAGSERVE_RERANK_TIER1_MODEL")
    with pytest.raises(OSError, match="recorded"):
        VllmGenerator(GeneratorSettings(model=str(tmp_path))).load_tokenizer()
    assert seen == [{"trust_remote_code": False, "local_files_only": True}] * 2
