"""`indexer tune-reader`: train an extractive reader (a span head, SQuAD 2.0 style) on a
SQuAD-format folder, export it as ONNX int8, measure it on a held-out folder and write a reader
folder (ragserve/read/folder.py) with a manifest that says where it came from.

Unlike `tune` and `tune-reranker` it publishes no index version: a reader reads passages, whatever
index they came from, so its folder stands alone (the project ships one in ragserve/read/default/).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from indexer.tune.reader_data import load_squad, training_examples
from indexer.tune.reader_eval import ReaderFigures, evaluate_reader
from indexer.tune.reader_model import ReaderTrainOptions, TrainStats, train_span_model
from ragserve.config import DEFAULT_EMBEDDER
from ragserve.digests import sha256_file
from ragserve.embed.base import resolve_embedder_path
from ragserve.read.export import export_span_model, write_manifest
from ragserve.read.folder import FORMAT, MANIFEST
from ragserve.read.onnx_reader import OnnxReader
from ragserve.read.spans import MAX_ANSWER_TOKENS

INT8 = "model-int8.onnx"
FP32 = "model.onnx"
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
SQUAD_SOURCE = "SQuAD 2.0 (Rajpurkar, Jia and Liang, 2018), https://rajpurkar.github.io/SQuAD-explorer/"


@dataclass(frozen=True)
class ReaderTuneJob:
    train: Path
    base: str
    out: Path
    dev: Path | None = None
    name: str = "ragserve-reader"
    # Share of answerable training questions also asked of another paragraph, as "no answer".
    negative_share: float = 0.3
    # The no-answer threshold declines at most this share of the held-out answerable questions.
    decline_answerable: float = 0.10
    # Tokens per (question, passage) pair when serving: a default chunk (200 tokens) and its question fit.
    max_length: int = 256
    data_licence: str = "CC-BY-SA-4.0"
    data_source: str = SQUAD_SOURCE
    weights_licence: str = "CC-BY-SA-4.0"
    progress: bool = True
    training: ReaderTrainOptions = field(default_factory=ReaderTrainOptions)


@dataclass(frozen=True)
class ReaderTuneReport:
    out: Path
    stats: TrainStats
    int8: ReaderFigures | None
    fp32: ReaderFigures | None
    threshold: float
    size_bytes: int
    seconds: float


def _base(base: str) -> tuple[str, str, str]:
    """(the path to load, the id to record, the digest of its weights; "" when not a local folder)."""
    path = resolve_embedder_path(DEFAULT_EMBEDDER if base == "default" else base)
    shown = DEFAULT_EMBEDDER if base == "default" or path != base else base
    folder = Path(path)
    digest = hashlib.sha256()
    found = [folder / f for f in _WEIGHT_FILES if (folder / f).is_file()]
    for f in found:
        digest.update(f"{f.name}:{sha256_file(f)}\n".encode())
    return path, shown, digest.hexdigest() if found else ""


def check_replaceable(out: Path) -> None:
    """`--out` is replaced whole: only nothing, an empty folder or a reader folder may be there
    (a mistyped path must never cost a folder of other files). ValueError otherwise."""
    if not out.exists() and not out.is_symlink():
        return
    if out.is_symlink() or not out.is_dir():
        raise ValueError(f"--out {out} is not a folder; refusing to replace it")
    if not any(out.iterdir()):
        return
    try:
        manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(
            f"--out {out} holds files but no reader {MANIFEST}; refusing to replace it (give a new folder)"
        )


def run_tune_reader(job: ReaderTuneJob, say: Callable[[str], None] = print) -> ReaderTuneReport:
    started = time.monotonic()
    check_replaceable(job.out)  # before the training, not after it
    train = load_squad(job.train)
    dev = load_squad(job.dev) if job.dev is not None else None
    examples = training_examples(train, job.negative_share, job.training.seed)
    base_path, base_id, base_digest = _base(job.base)
    say(f"training on {len(examples)} examples from {train.name} (base {base_id})")
    model, tokenizer, stats = train_span_model(base_path, examples, job.training, progress=job.progress)
    say(f"trained {stats.steps} steps in {stats.seconds:.0f} s (last loss {stats.last_loss})")

    job.out.parent.mkdir(parents=True, exist_ok=True)
    work = job.out.parent / f".{job.out.name}.tmp-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    try:
        export_span_model(model, tokenizer, work, FP32, INT8)
        common: dict[str, Any] = {
            "name": job.name,
            "max_length": job.max_length,
            "max_answer_tokens": MAX_ANSWER_TOKENS,
        }
        fp32 = int8 = None
        threshold = 0.0
        if dev is not None:
            write_manifest(work, FP32, 0.0, common)
            fp32 = evaluate_reader(OnnxReader.from_folder(work, measure_cost=False), dev, job.decline_answerable)
            say(f"held-out, fp32: {_line(fp32)}")
            (work / FP32).unlink()
            write_manifest(work, INT8, 0.0, common)
            int8 = evaluate_reader(OnnxReader.from_folder(work, measure_cost=False), dev, job.decline_answerable)
            say(f"held-out, int8: {_line(int8)}")
            threshold = int8.threshold
        else:
            (work / FP32).unlink()
        write_manifest(
            work, INT8, threshold, {**common, **_provenance(job, train, stats, base_id, base_digest, int8, fp32)}
        )
        OnnxReader.from_folder(work, measure_cost=False)  # the folder as written loads
        if job.out.exists():
            shutil.rmtree(job.out)
        work.rename(job.out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    size = sum(p.stat().st_size for p in job.out.iterdir() if p.is_file())
    return ReaderTuneReport(job.out, stats, int8, fp32, threshold, size, time.monotonic() - started)


def _line(f: ReaderFigures) -> str:
    return (
        f"EM {f.exact_match:.3f}, holds gold {f.contains_gold:.3f}, F1 {f.f1:.3f}, no-answer AUC "
        f"{f.no_answer_auc if f.no_answer_auc is None else round(f.no_answer_auc, 3)}, threshold {f.threshold:.3f} "
        f"declines {f.declined_answerable:.1%} answerable / {f.declined_unanswerable:.1%} unanswerable / "
        f"{f.declined_other_paragraph:.1%} other paragraphs (AUC {f.other_paragraph_auc}); "
        f"ms 1 passage p50 {f.ms_1_p50:.1f} p95 {f.ms_1_p95:.1f}, 4 passages p50 {f.ms_4_p50:.1f} p95 {f.ms_4_p95:.1f}"
    )


def _provenance(
    job: ReaderTuneJob,
    train: Any,
    stats: TrainStats,
    base_id: str,
    base_digest: str,
    int8: ReaderFigures | None,
    fp32: ReaderFigures | None,
) -> dict[str, Any]:
    from ragserve.generate.host import read_host_cpu

    out: dict[str, Any] = {
        "base": {"id": base_id, "weights_sha256": base_digest},
        "training_data": {
            "name": train.name,
            "questions": len(train.questions),
            "paragraphs": len(train.paragraphs),
            "licence": job.data_licence,
            "source": job.data_source,
        },
        "training": {
            "method": "span head (start/end over tokens, [CLS] for no answer), SQuAD 2.0 style",
            "examples": stats.examples,
            "answerable_examples": stats.answerable,
            "negative_share": job.negative_share,
            "steps": stats.steps,
            "options": {k: v for k, v in asdict(job.training).items() if k != "max_seconds"},
        },
        "weights_licence": job.weights_licence,
        "quantization": "onnxruntime dynamic int8, per channel",
    }
    if int8 is not None:
        out["heldout"] = {
            **int8.as_dict(),
            "decline_answerable_target": job.decline_answerable,
            "cpu": read_host_cpu().model,
            "read_against": "the gold paragraph",
        }
    if fp32 is not None:
        keep = ("exact_match", "contains_gold", "overlaps_gold", "f1", "no_answer_auc", "other_paragraph_auc")
        out["heldout_fp32"] = {k: v for k, v in fp32.as_dict().items() if k in keep}
    return out
