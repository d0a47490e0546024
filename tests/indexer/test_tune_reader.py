"""`indexer tune-reader` on a tiny SQuAD-format fixture and a tiny random BERT: the examples it
learns from, the held-out measures, and a reader folder that loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from indexer.tune.reader_data import load_squad, normalize, training_examples
from indexer.tune.reader_eval import auc, decline_threshold, token_f1

PARAGRAPHS = {
    "Penicillin#0": "Penicillin was discovered in 1928 by Alexander Fleming at St Mary's Hospital in London.",
    "Penicillin#1": "Mass production of the drug began during the Second World War in the United States.",
    "Chopin#0": "Frédéric Chopin, né à Żelazowa Wola, was a Polish composer born in 1810.",
}
QUESTIONS = [
    ("q1", "Who discovered penicillin?", "Alexander Fleming", "Penicillin#0"),
    ("q2", "When was penicillin discovered?", "1928", "Penicillin#0"),
    ("q3", "When did mass production begin?", "during the Second World War", "Penicillin#1"),
    ("q4", "Where was Chopin born?", "Żelazowa Wola", "Chopin#0"),
    ("q5", "Who was Chopin's teacher?", None, "Chopin#0"),
]


def write_squad(folder: Path) -> Path:
    folder.mkdir(parents=True)
    with (folder / "corpus.jsonl").open("w") as handle:
        for doc, text in PARAGRAPHS.items():
            handle.write(json.dumps({"_id": doc, "title": doc.split("#")[0], "text": text}) + "\n")
    with (folder / "questions.jsonl").open("w") as handle:
        for qid, question, answer, doc in QUESTIONS:
            row = {"id": qid, "question": question, "doc_id": doc, "impossible": answer is None}
            row["answers"] = [answer] if answer else []
            row["answer_starts"] = [PARAGRAPHS[doc].index(answer)] if answer else []
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return folder


def tiny_base(folder: Path) -> Path:
    """A 1-layer, 32-wide random BERT with the bundled MiniLM's tokenizer: trains in a second."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from ragserve.embed.base import resolve_embedder_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_embedder_path("all-MiniLM-L6-v2"))
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
    )
    BertModel(config).save_pretrained(str(folder))  # type: ignore[no-untyped-call]
    tokenizer.save_pretrained(str(folder))
    return folder


def test_examples_teach_gold_spans_and_no_answer_from_unanswerable_and_other_paragraphs(tmp_path: Path) -> None:
    data = load_squad(write_squad(tmp_path / "squad"))
    examples = training_examples(data, negative_share=1.0, seed=0)
    spans = [e for e in examples if e.answer_start is not None]
    assert len(spans) == 4
    for e in spans:
        start = e.answer_start or 0
        assert e.paragraph[start : start + len(e.answer_text)] == e.answer_text
    negatives = [e for e in examples if e.answer_start is None]
    # q5 (unanswerable), q1-q3 against the other Penicillin paragraph; q4 against another article's.
    assert len(negatives) == 5
    for e in negatives:
        gold = next(a for _, q, a, _ in QUESTIONS if q == e.question)
        assert gold is None or normalize(gold) not in normalize(e.paragraph)


def test_held_out_measures() -> None:
    assert token_f1("Alexander Fleming", "Fleming") == pytest.approx(2 / 3)
    assert token_f1("the 1928", "1928") == 1.0
    assert auc([3.0, 4.0], [1.0, 2.0]) == 1.0
    assert auc([1.0], [1.0]) == 0.5
    assert auc([], [1.0]) is None
    margins = [float(m) for m in range(10)]
    threshold = decline_threshold(margins, 0.10)
    assert sum(m < threshold for m in margins) == 1


def test_tune_reader_writes_a_reader_folder_that_loads(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from indexer.cli import app
    from ragserve.read.onnx_reader import OnnxReader

    squad = write_squad(tmp_path / "squad")
    base = tiny_base(tmp_path / "base")
    out = tmp_path / "reader"
    args = ["tune-reader", "--train", str(squad), "--dev", str(squad), "--base", str(base), "--out", str(out)]
    result = CliRunner().invoke(
        app, [*args, "--max-steps", "1", "--batch-size", "4", "--name", "tiny", "--no-progress"]
    )
    assert result.exit_code == 0, result.output
    assert "wrote reader" in result.output

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "ragserve-reader" and manifest["training"]["steps"] == 1
    assert manifest["training_data"] == {
        "name": "squad",
        "questions": 5,
        "paragraphs": 3,
        "licence": "CC-BY-SA-4.0",
        "source": manifest["training_data"]["source"],
    }
    assert manifest["base"]["id"] == str(base) and len(manifest["base"]["weights_sha256"]) == 64
    assert manifest["heldout"]["answerable"] == 4 and manifest["heldout"]["unanswerable"] == 1
    assert manifest["no_answer_threshold"] == manifest["heldout"]["threshold"]
    assert not (out / "model.onnx").exists()  # only the int8 model ships

    reader = OnnxReader.from_folder(out, measure_cost=False)
    assert reader.model_id.startswith("tiny+")
    passage = PARAGRAPHS["Chopin#0"]
    (span,) = reader.read("Where was Chopin born?", [passage])
    assert span.text == passage[span.start : span.end]


def test_tune_reader_never_replaces_a_folder_that_is_not_a_reader(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from indexer.cli import app

    squad = write_squad(tmp_path / "squad")
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("precious")
    args = ["tune-reader", "--train", str(squad), "--base", "x", "--out", str(home), "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "no reader manifest.json" in result.output
    assert (home / "notes.txt").read_text() == "precious"


def test_a_missing_training_folder_exits_with_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from indexer.cli import app

    args = ["tune-reader", "--train", str(tmp_path / "none"), "--base", "x", "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(app, [*args, "--no-progress"])
    assert result.exit_code == 2
    assert "corpus.jsonl is missing" in result.output
