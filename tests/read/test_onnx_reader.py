"""The shipped default reader (ragserve/read/default/) on ONNX Runtime: spans, code point offsets,
no-answer scores, and refusal of a folder that does not match its manifest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ragserve.read.base import Reader, ReadSpan
from ragserve.read.folder import DEFAULT_READER_DIR, MANIFEST, ReaderLoadError
from ragserve.read.onnx_reader import OnnxReader

PENICILLIN = (
    "Penicillin was discovered in 1928 by Alexander Fleming, a Scottish physician, at St Mary's Hospital "
    "in London. It was the first antibiotic to be used widely."
)
CHOPIN = (
    "Frédéric Chopin, né à Żelazowa Wola, was a Polish composer and virtuoso pianist of the Romantic era. "
    "He was born in 1810."
)


@pytest.fixture(scope="module")
def reader() -> OnnxReader:
    return OnnxReader.from_folder()


def test_the_default_reader_meets_the_protocol_and_states_its_threshold_and_cost(reader: OnnxReader) -> None:
    assert isinstance(reader, Reader)
    assert reader.model_id.startswith("ragserve-reader-minilm-l6+")
    assert np.isfinite(reader.no_answer_threshold)
    assert reader.cost.ms_per_passage > 0
    assert reader.cost.passages_within(0.0) == 0
    assert reader.manifest["training_data"]["licence"] == "CC-BY-SA-4.0"


def test_an_easy_question_gets_a_span_that_holds_the_answer(reader: OnnxReader) -> None:
    (span,) = reader.read("Who discovered penicillin?", [PENICILLIN])
    assert span.passage == 0
    assert "Fleming" in span.text
    assert span.text == PENICILLIN[span.start : span.end]


def test_offsets_are_code_points_of_the_passage_after_non_ascii_text(reader: OnnxReader) -> None:
    (span,) = reader.read("In what year was Chopin born?", [CHOPIN])
    assert span.text == CHOPIN[span.start : span.end]
    assert "1810" in span.text
    # Every token's offsets, whatever the model says: each accented or Polish letter counts one.
    enc, _ = reader.logits("Where was Chopin born?", [CHOPIN])
    offsets = [span for span, seq in zip(enc.offsets(0), enc.sequence_ids(0), strict=True) if seq == 1]
    year = CHOPIN.index("1810")
    assert year != CHOPIN.encode("utf-8").index(b"1810")  # bytes would be off by three
    assert (year, year + 4) in offsets
    assert CHOPIN.index("Żelazowa") in [a for a, _ in offsets]


def test_a_passage_that_does_not_answer_scores_below_one_that_does(reader: OnnxReader) -> None:
    answered, off_topic = reader.read("Who discovered penicillin?", [PENICILLIN, CHOPIN])
    assert (answered.passage, off_topic.passage) == (0, 1)
    assert off_topic.margin < answered.margin
    (unanswerable,) = reader.read("What is the capital of Australia?", [PENICILLIN])
    assert unanswerable.margin < answered.margin
    # Far apart on either side of the shipped threshold (about +13 and -9 against 0.73).
    assert answered.answers(reader.no_answer_threshold)
    assert not unanswerable.answers(reader.no_answer_threshold)


def test_many_passages_are_read_in_batches_and_keep_their_order(reader: OnnxReader) -> None:
    passages = [PENICILLIN, CHOPIN, "", "Short.", CHOPIN, PENICILLIN * 12]
    spans = reader.read("Who discovered penicillin?", passages)
    assert [s.passage for s in spans] == list(range(len(passages)))
    for span, passage in zip(spans, passages, strict=True):
        assert isinstance(span, ReadSpan)
        assert span.text == passage[span.start : span.end]
    assert spans[2].text == ""  # an empty passage has no span
    assert reader.read("anything", []) == []


def _copy_default(tmp_path: Path) -> Path:
    folder = tmp_path / "reader"
    shutil.copytree(DEFAULT_READER_DIR, folder)
    return folder


def test_a_folder_that_does_not_match_its_manifest_is_refused(tmp_path: Path) -> None:
    folder = _copy_default(tmp_path)
    manifest = json.loads((folder / MANIFEST).read_text())

    (folder / MANIFEST).write_text(json.dumps({**manifest, "format": "something-else"}))
    with pytest.raises(ReaderLoadError, match="format"):
        OnnxReader.from_folder(folder, measure_cost=False)

    (folder / MANIFEST).write_text(json.dumps({**manifest, "max_length": 4096}))
    with pytest.raises(ReaderLoadError, match="max_length"):
        OnnxReader.from_folder(folder, measure_cost=False)

    # No room for the longest question: every long question would fail, so the folder is refused.
    (folder / MANIFEST).write_text(json.dumps({**manifest, "max_length": 40}))
    with pytest.raises(ReaderLoadError, match=r"max_length 40 is not a whole number in 68\.\.512"):
        OnnxReader.from_folder(folder, measure_cost=False)

    (folder / MANIFEST).write_text(json.dumps(manifest))
    with (folder / "tokenizer_config.json").open("a") as handle:
        handle.write(" ")
    with pytest.raises(ReaderLoadError, match=r"tokenizer_config\.json does not match its sha256"):
        OnnxReader.from_folder(folder, measure_cost=False)

    (folder / MANIFEST).unlink()
    with pytest.raises(ReaderLoadError, match=r"no manifest\.json"):
        OnnxReader.from_folder(folder, measure_cost=False)


def test_a_model_that_is_not_a_span_head_is_refused(tmp_path: Path) -> None:
    folder = _copy_default(tmp_path)
    manifest = json.loads((folder / MANIFEST).read_text())
    (folder / manifest["onnx"]).write_bytes(b"not an onnx graph")
    from ragserve.digests import sha256_file

    manifest["files"][manifest["onnx"]] = sha256_file(folder / manifest["onnx"])
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ReaderLoadError, match="cannot be loaded"):
        OnnxReader.from_folder(folder, measure_cost=False)
