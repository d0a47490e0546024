"""A question-answering model folder (AutoModelForQuestionAnswering shape) loads through the
reader setting: exported to ONNX int8 once, then read from its cache. The model is a tiny random
one the test builds: its spans mean nothing, their offsets must still hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragserve.config import ReaderSettings
from ragserve.errors import ConfigError
from ragserve.factory.parts import make_reader
from ragserve.read.export import reader_folder
from ragserve.read.folder import DEFAULT_READER_DIR

WORDS = ["who", "found", "it", "fleming", "in", "london", "the", "mould", "grew", "é", "##s"]


def _tiny_qa_model(folder: Path) -> None:
    from transformers import BertConfig, BertForQuestionAnswering, BertTokenizerFast

    folder.mkdir()
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(str(folder))
    config = BertConfig(
        vocab_size=5 + len(WORDS),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=512,
    )
    BertForQuestionAnswering(config).save_pretrained(str(folder))


@pytest.mark.slow
def test_a_question_answering_model_folder_loads_through_the_reader_setting(tmp_path: Path) -> None:
    source = tmp_path / "tiny-qa"
    _tiny_qa_model(source)
    settings = ReaderSettings(model=str(source), onnx_cache_dir=tmp_path / "cache")
    reader = make_reader(settings)
    assert reader is not None
    passage = "Fleming found the mould in London."
    (span,) = reader.read("who found it", [passage])
    assert span.passage == 0 and span.text == passage[span.start : span.end]
    exported = reader_folder(str(source), tmp_path / "cache")
    built = (exported / "model-int8.onnx").stat().st_mtime_ns
    assert reader_folder(str(source), tmp_path / "cache") == exported  # exported once, then reused
    assert (exported / "model-int8.onnx").stat().st_mtime_ns == built
    assert not (exported / "model.onnx").exists()


def test_the_empty_setting_is_the_shipped_reader_and_a_folder_of_something_else_is_refused(tmp_path: Path) -> None:
    assert reader_folder("", tmp_path) == DEFAULT_READER_DIR
    assert make_reader(ReaderSettings(enabled=False)) is None
    other = tmp_path / "not-a-model"
    other.mkdir()
    (other / "notes.txt").write_text("hello")
    with pytest.raises(ConfigError, match="RAGSERVE_READER_MODEL"):
        reader_folder(str(other), tmp_path / "cache")
