"""The reader's tokenizer (read/tokenizing.py, Hugging Face `tokenizers` alone) gives what the
transformers fast tokenizer it replaced gave: the same ids, masks, token types, offsets and
sequence ids, padding and truncation included, and a refusal of a folder without tokenizer.json."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from ragserve.read.folder import DEFAULT_READER_DIR, ReaderLoadError, read_spec
from ragserve.read.onnx_reader import OnnxReader
from ragserve.read.tokenizing import ReaderTokenizer

QUESTION = "Où est né Frédéric Chopin, et en quelle année?"
PASSAGES = [
    "Frédéric Chopin, né à Żelazowa Wola, was a Polish composer. He was born in 1810.",
    "",
    "Short.",
    " ".join(["The committee met in the old town hall to discuss the harbour's 3.5% levy."] * 40),
    "数学 and naïve café 😀 text\twith\ncontrol characters",
]


def test_pairs_match_the_transformers_fast_tokenizer_token_for_token() -> None:
    from transformers import AutoTokenizer

    max_length = read_spec(DEFAULT_READER_DIR).max_length
    ours = ReaderTokenizer(DEFAULT_READER_DIR, max_length).pairs(QUESTION, PASSAGES)
    theirs = AutoTokenizer.from_pretrained(str(DEFAULT_READER_DIR), local_files_only=True)(
        [QUESTION] * len(PASSAGES),
        PASSAGES,
        truncation="only_second",
        max_length=max_length,
        padding="longest",
        return_offsets_mapping=True,
        return_token_type_ids=True,
        return_tensors="np",
    )
    assert ours.inputs["input_ids"].shape[1] == max_length  # the long passage was cut, the rest padded
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        np.testing.assert_array_equal(ours.inputs[name], theirs[name])
    for row in range(len(PASSAGES)):
        assert ours.sequence_ids(row) == theirs.sequence_ids(row)
        assert ours.offsets(row) == [(int(a), int(b)) for a, b in theirs["offset_mapping"][row]]


def test_a_single_text_has_its_offsets_without_special_tokens() -> None:
    from transformers import AutoTokenizer

    tokenizer = ReaderTokenizer(DEFAULT_READER_DIR, 256)
    theirs = AutoTokenizer.from_pretrained(str(DEFAULT_READER_DIR), local_files_only=True)(
        QUESTION * 30, add_special_tokens=False, return_offsets_mapping=True
    )
    offsets = tokenizer.offsets(QUESTION * 30)
    assert len(offsets) > 256  # no truncation for the question alone
    assert offsets == [tuple(o) for o in theirs["offset_mapping"]]


def test_a_folder_without_tokenizer_json_is_refused_by_name(tmp_path: Path) -> None:
    folder = tmp_path / "reader"
    shutil.copytree(DEFAULT_READER_DIR, folder)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json is missing"):
        ReaderTokenizer(folder, 256)
    # The reader's own check (its manifest lists the file) refuses it first, as a ReaderLoadError.
    with pytest.raises(ReaderLoadError, match=r"tokenizer\.json"):
        OnnxReader.from_folder(folder)
