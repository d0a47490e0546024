"""Reader folders: which one a setting names (the one this project ships, a reader folder as
`ragserve-index tune-reader` writes it, or a question-answering model exported to one once), and
how a span model becomes one (ONNX export, int8 quantization, manifest)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ragserve.digests import sha256_file
from ragserve.errors import ConfigError
from ragserve.pretrained import load_options
from ragserve.read.folder import DEFAULT_READER_DIR, FORMAT, FORMAT_VERSION, MANIFEST, OUTPUT

log = logging.getLogger(__name__)

# An exported question-answering model reads question + passage up to this many tokens.
EXPORT_MAX_LENGTH = 384
EXPORT_MAX_ANSWER_TOKENS = 30
_INT8 = "model-int8.onnx"


def reader_folder(model: str, cache_dir: Path) -> Path:
    """`model` empty: the shipped reader; a folder holding a reader manifest: that folder; else a
    local folder or HF id holding a question-answering model, exported into `cache_dir` once."""
    if not model:
        return DEFAULT_READER_DIR
    folder = Path(model).expanduser()
    if (folder / MANIFEST).is_file():
        return folder
    return export_qa_model(model, cache_dir)


def export_qa_model(source: str, cache_dir: Path) -> Path:
    """`source` (AutoModelForQuestionAnswering shape) as a reader folder under `cache_dir`, keyed on
    what it is: a local folder by its files' digests, a hub id by its name. Its no-answer threshold
    is 0 (span and no-answer scores compared as they are): no held-out questions were measured."""
    target = cache_dir / f"{Path(source).name or 'reader'}-{_source_key(source)}"
    if (target / MANIFEST).is_file():
        return target
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    try:
        model = AutoModelForQuestionAnswering.from_pretrained(source, **load_options(source)).eval()
        tokenizer = AutoTokenizer.from_pretrained(source, **load_options(source))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"RAGSERVE_READER_MODEL={source}: not a question-answering model ({exc})") from exc
    log.info("exporting the reader %s to ONNX int8 (once) into %s", source, target)
    cache_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=cache_dir, prefix=".export-"))
    try:
        export_span_model(model, tokenizer, work, "model.onnx", _INT8)
        (work / "model.onnx").unlink()
        max_length = min(EXPORT_MAX_LENGTH, int(getattr(tokenizer, "model_max_length", EXPORT_MAX_LENGTH)))
        write_manifest(
            work,
            _INT8,
            0.0,
            {
                "name": Path(source).name or "reader",
                "max_length": max_length,
                "max_answer_tokens": EXPORT_MAX_ANSWER_TOKENS,
                "base": {"id": source},
                "training": "none here: exported as found (RAGSERVE_READER_MODEL)",
            },
        )
        os.replace(work, target)  # whole or not at all: a crash leaves no half-written reader
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return target


def _source_key(source: str) -> str:
    folder = Path(source).expanduser()
    digest = hashlib.sha256(source.encode())
    if folder.is_dir():
        for path in sorted(p for p in folder.iterdir() if p.is_file()):
            digest.update(path.name.encode())
            digest.update(sha256_file(path).encode())
    return digest.hexdigest()[:16]


def export_span_model(model: Any, tokenizer: Any, folder: Path, fp32_name: str, int8_name: str) -> None:
    """ONNX export (start and end logits stacked as `span_logits`, (batch, seq, 2)) and dynamic int8
    quantization, the way the rerank tier is exported; tokenizer and config written beside them."""
    import torch

    from ragserve.onnx_export import export_bert, quantize_int8

    class _SpanLogits(torch.nn.Module):  # type: ignore[misc]  # torch is not followed by mypy (pyproject)
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            out = self.net(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            return torch.stack([out.start_logits, out.end_logits], dim=-1)

    folder.mkdir(parents=True, exist_ok=True)
    export_bert(_SpanLogits().eval(), folder / fp32_name, OUTPUT, {0: "batch", 1: "seq"})
    quantize_int8(folder / fp32_name, folder / int8_name, per_channel=True)
    tokenizer.save_pretrained(str(folder))
    model.config.architectures = [type(model).__name__]  # a base's config names its own (e.g. BertModel)
    model.config.save_pretrained(str(folder))


def write_manifest(folder: Path, onnx: str, threshold: float, extra: dict[str, Any]) -> None:
    """The folder's manifest: every file but other ONNX models, with its sha256 (checked at load)."""
    files = {
        p.name: sha256_file(p)
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != MANIFEST and (p.suffix != ".onnx" or p.name == onnx)
    }
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "onnx": onnx,
        "output": OUTPUT,
        "files": files,
        "no_answer_threshold": round(threshold, 4),
        **extra,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
