"""The cross-encoder on ONNX Runtime (int8 dynamic quantization on CPU): the model exported once
into a cache folder, then scored with the tokenizing both backends share (cross_encoder.py)."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragserve.config import RerankSettings, default_of
from ragserve.onnx_export import export_bert, quantize_int8
from ragserve.pretrained import load_options
from ragserve.rerank.base import EncodedPair
from ragserve.rerank.cross_encoder import TokenizingEncoder, load_error, pinned, read_config, relevance

log = logging.getLogger(__name__)


def _cache_key(model: str, config: Any, quantize: bool) -> str:
    """Changes when the model's files or the exporter change, so a stale export is never reused."""
    import torch

    h = hashlib.sha256()
    h.update(model.encode())
    h.update(json.dumps(config.to_dict(), sort_keys=True, default=str).encode())
    local = Path(model)
    if local.is_dir():
        for f in sorted(local.iterdir()):
            if f.is_file():
                st = f.stat()
                h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    h.update(f"torch={torch.__version__};int8={quantize}".encode())
    return h.hexdigest()[:16]


def export_onnx(model: str, setting: str, cache_dir: Path, quantize: bool) -> Path:
    """Export once (at load time) into `cache_dir`; later starts reuse the file."""
    config = read_config(model, setting)
    slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in model.strip("/").split("/")[-1]) or "model"
    folder = cache_dir / f"{slug}-{_cache_key(model, config, quantize)}"
    target = folder / ("model.int8.onnx" if quantize else "model.onnx")
    if target.is_file():
        return target

    from transformers import AutoModelForSequenceClassification

    try:
        net = AutoModelForSequenceClassification.from_pretrained(
            model, attn_implementation="eager", **load_options(model)
        ).eval()
    except Exception as exc:
        raise load_error(model, setting, exc) from exc
    cache_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".export-", dir=cache_dir))
    try:
        fp32 = work / "model.onnx"
        export_bert(net, fp32, "logits", {0: "batch"})
        if quantize:
            quantize_int8(fp32, work / "model.int8.onnx", per_channel=False)
            fp32.unlink()
        # Publish the finished folder with one rename: a crash mid-export leaves no half file behind.
        if folder.exists():
            shutil.rmtree(folder)
        work.rename(folder)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    log.info("exported %s to %s", model, target)
    return target


class OnnxCrossEncoder(TokenizingEncoder):
    """A cross-encoder on ONNX Runtime; int8 dynamic quantization on CPU."""

    def __init__(
        self,
        model: str,
        setting: str,
        cache_dir: Path,
        device: str = default_of(RerankSettings, "device"),
        max_seq_len: int = default_of(RerankSettings, "max_seq_len"),
        threads: int = default_of(RerankSettings, "threads"),
        cpus: frozenset[int] | None = None,
    ) -> None:
        config = read_config(model, setting)
        self._load_tokenizer(model, setting)
        self._quantized = device == "cpu"  # dynamic int8 kernels are a CPU feature
        path = export_onnx(model, setting, cache_dir, self._quantized)
        try:
            self._open(path, device, threads, cpus)
        except Exception as exc:
            raise load_error(model, setting, exc) from exc
        self._describe(model, config, max_seq_len, cpus)

    @classmethod
    def from_export(
        cls,
        onnx_path: Path,
        model_dir: Path,
        model_id: str,
        *,
        threads: int,
        cpus: frozenset[int] | None,
        max_seq_len: int,
    ) -> OnnxCrossEncoder:
        """An already exported int8 model (`model_dir`: its config and tokenizer files), as an index
        version ships it, on CPU; reported under `model_id`. Library errors pass through as raised."""
        from transformers import AutoConfig, AutoTokenizer

        encoder = cls.__new__(cls)
        config = AutoConfig.from_pretrained(str(model_dir), **load_options(model_dir))
        encoder._use_tokenizer(AutoTokenizer.from_pretrained(str(model_dir), **load_options(model_dir)))
        encoder._quantized = True
        encoder._open(onnx_path, "cpu", threads, cpus)
        encoder._describe(model_id, config, max_seq_len, cpus)
        return encoder

    def _open(self, path: Path, device: str, threads: int, cpus: frozenset[int] | None) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads > 0:
            options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Spinning workers would steal the cores the generator and the embedder run on.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if cpus and threads > 1:
            # The caller thread is pinned by `pinned`; ORT's own pool threads get the same set (1-based ids).
            ids = ",".join(str(c + 1) for c in sorted(cpus))
            options.add_session_config_entry("session.intra_op_thread_affinities", ";".join([ids] * (threads - 1)))
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
        self._session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
        self._inputs = {i.name for i in self._session.get_inputs()}

    @property
    def backend(self) -> str:
        return "onnx-int8" if self._quantized else "onnx-fp32"

    def score(self, pairs: Sequence[EncodedPair]) -> np.ndarray:
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        ids, mask, types = self._pad(pairs)
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        feed = {k: v for k, v in feed.items() if k in self._inputs}
        with pinned(self._cpus):
            (logits,) = self._session.run(["logits"], feed)
        return relevance(logits)
