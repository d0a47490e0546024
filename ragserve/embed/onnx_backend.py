"""The bi-encoder on ONNX Runtime: exported once to a cache folder, optionally int8-quantized.

The export (torch -> ONNX, then dynamic int8 quantization) runs when the embedder is first built
for a model, i.e. at set-up or index time, never per request. Pooling and normalization match
sentence-transformers' all-MiniLM-L6-v2 (mean over attention-masked tokens, then L2).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from ragserve.config import EmbedderSettings, default_home, default_of
from ragserve.embed.base import NamedEmbedder, QueryEmbedding, fits_window, resolve_embedder_path
from ragserve.errors import ConfigError
from ragserve.onnx_export import export_bert, keyword_inputs, quantize_int8
from ragserve.pretrained import load_options

log = logging.getLogger(__name__)

FP32_FILE = "model.onnx"
INT8_FILE = "model.int8.onnx"
# Bumped whenever the export itself changes, so an older cached export is never reused.
EXPORT_REVISION = "2-eager-attention"


def default_onnx_cache() -> Path:
    return default_home() / "onnx"


def _max_seq_length(model_path: Path) -> int:
    config = model_path / "sentence_bert_config.json"
    if config.is_file():
        return int(json.loads(config.read_text()).get("max_seq_length", 256))
    return 256


def _cache_key(model_path: Path) -> str:
    """Keyed by the weights' identity so a changed model never reuses a stale export."""
    digest = hashlib.sha256(f"{EXPORT_REVISION}:{model_path.resolve()}".encode())
    for name in ("model.safetensors", "pytorch_model.bin", "config.json"):
        path = model_path / name
        if path.is_file():
            st = path.stat()
            digest.update(f"{name}:{st.st_size}:{int(st.st_mtime)}".encode())
    return digest.hexdigest()[:16]


def export_onnx(model_path: Path, folder: Path, quantize: bool) -> Path:
    """Export the transformer (token embeddings out) and, if asked, an int8 dynamic-quantized copy."""
    target = folder / (INT8_FILE if quantize else FP32_FILE)
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    fp32 = folder / FP32_FILE
    if not fp32.is_file():
        from transformers import AutoModel

        log.info("exporting %s to ONNX at %s (once)", model_path, fp32)
        # Eager attention: the SDPA path exports its mask as Where/IsNaN over the full score
        # tensor, which costs much of ORT's run time and blocks ORT's attention fusion.
        bert = AutoModel.from_pretrained(
            str(model_path), attn_implementation="eager", **load_options(model_path)
        ).eval()
        tmp = folder / f".{FP32_FILE}.{os.getpid()}.tmp"
        export_bert(keyword_inputs(bert, "last_hidden_state"), tmp, "last_hidden_state", {0: "batch", 1: "seq"})
        os.replace(tmp, fp32)  # a killed export never leaves a half-written model behind
    if quantize:
        log.info("quantizing %s to int8 (dynamic)", fp32)
        tmp = folder / f".{INT8_FILE}.{os.getpid()}.tmp.onnx"
        # Per-channel weight scales: per-tensor int8 cost ~0.05-0.09 cosine against fp32 here,
        # per-channel < 0.02.
        quantize_int8(fp32, tmp, per_channel=True)
        os.replace(tmp, target)
    return target


class OnnxEmbedder(NamedEmbedder):
    """Same vectors (up to rounding / int8 error) as SentenceTransformerEmbedder, on ONNX Runtime."""

    def __init__(
        self,
        model: str = default_of(EmbedderSettings, "model"),
        quantize: bool = default_of(EmbedderSettings, "onnx_int8"),
        cache_dir: Path | None = None,
        *,
        threads: int,
        spin: bool,
        workers: int = 1,
    ) -> None:
        path = Path(resolve_embedder_path(model))
        if not (path / "config.json").is_file():
            raise ConfigError(f"ONNX embedder needs a local model folder, got {model!r}")
        folder = (cache_dir or default_onnx_cache()) / _cache_key(path)
        try:
            onnx_path = export_onnx(path, folder, quantize)
        except Exception as exc:  # export failures come from many libraries; report one clear error
            raise ConfigError(f"cannot export embedder {model!r} to ONNX: {exc}") from exc
        self._open(onnx_path, path, threads, spin)
        self._set_identity(model, int(json.loads((path / "config.json").read_text())["hidden_size"]))
        self.quantized = quantize
        # Batches run side by side on this many threads (each session run on its caller's thread when
        # `threads` is 1): no barrier between cores inside an operator, so a core taken by another
        # process stalls one batch, not every operator of every batch.
        self._workers = max(1, workers)
        self._gate: _Gate | None = None

    def follow_workers(self, wanted: Callable[[], int], most: int) -> None:
        """Indexing on a shared host: up to `most` batches side by side, at any moment no more than
        `wanted()` (read before each batch starts, so a busy neighbour is felt within a batch)."""
        self._workers = max(1, most)
        self._gate = _Gate(wanted)

    @classmethod
    def from_export(cls, onnx_path: Path, model_dir: Path, model_id: str, *, threads: int, spin: bool) -> OnnxEmbedder:
        """An already exported model (`model_dir`: its config and tokenizer files), as a tuned
        index version ships it; reported under `model_id`."""
        embedder = cls.__new__(cls)
        embedder._open(onnx_path, model_dir, threads, spin)
        embedder._set_identity(model_id, int(json.loads((model_dir / "config.json").read_text())["hidden_size"]))
        embedder.quantized = True
        embedder._workers = 1
        embedder._gate = None
        return embedder

    def _open(self, onnx_path: Path, model_dir: Path, threads: int, spin: bool) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if not spin:
            # In the server, idle-spinning pool threads would steal the cores the reranker and the
            # generator need between queries; a batch indexer keeps spinning for throughput.
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        self._inputs = {i.name for i in self._session.get_inputs()}
        self._max_len = _max_seq_length(model_dir)
        self._tokenizer = _open_tokenizer(model_dir, self._max_len)
        self.onnx_path = onnx_path

    @property
    def backend(self) -> str:
        """How its vectors are made, as an index manifest records it (`embedder_backend`)."""
        return "onnx-int8" if self.quantized else "onnx"

    @property
    def max_seq_length(self) -> int:
        return self._max_len

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def output_width(self) -> int:
        """The width of the vectors the model really makes, from one input of the full stated length:
        a model whose graph takes fewer positions fails here, at load, not on a long query."""
        return int(self._run([" ".join(["length"] * (self._max_len + 8))]).shape[1])

    def _run(self, texts: list[str]) -> np.ndarray:
        return self._run_counted(texts)[0]

    def _run_counted(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The vectors and each text's token count as the model saw it (after truncation)."""
        return self._run_ids(self._token_ids(texts))

    def _token_ids(self, texts: list[str]) -> list[list[int]]:
        if isinstance(self._tokenizer, Tokenizer):
            return [encoding.ids for encoding in self._tokenizer.encode_batch(texts)]
        enc = self._tokenizer(
            texts,
            truncation=True,
            max_length=self._max_len,
            return_attention_mask=False,
            return_token_type_ids=False,
            verbose=False,
        )
        return list(enc["input_ids"])

    def _run_ids(self, rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        """Pad the rows to the longest of them (right) and run the model; padding is masked out of
        attention and of the mean, so which id pads does not change a vector."""
        width = max(len(r) for r in rows)
        ids = np.zeros((len(rows), width), dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        given = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        feeds = {name: value for name, value in given.items() if name in self._inputs}
        hidden = np.asarray(self._session.run(None, feeds)[0], dtype=np.float32)
        weights = mask[..., None].astype(np.float32)
        pooled: np.ndarray = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        out: np.ndarray = (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)
        return out, mask.sum(axis=1)

    def _encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        # Tokenized once, unpadded; sorted by token count so each batch pads to little more than
        # its own rows (sorting by characters left about 15% padding on SciFact's chunks, by
        # tokens under 1% over a group of a thousand chunks).
        ids = self._token_ids(texts)
        order = sorted(range(len(texts)), key=lambda i: len(ids[i]), reverse=True)
        batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
        out = np.empty((len(texts), self._dim), dtype=np.float32)

        def run(rows: list[int]) -> None:
            if self._gate is None:
                out[rows] = self._run_ids([ids[i] for i in rows])[0]
                return
            with self._gate:
                out[rows] = self._run_ids([ids[i] for i in rows])[0]

        if self._workers > 1 and len(batches) > 1:
            with ThreadPoolExecutor(self._workers, thread_name_prefix="embed") as pool:
                list(pool.map(run, batches))
        else:
            for rows in batches:
                run(rows)
        return out

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        return self._encode(texts, batch_size=max(1, len(texts)))

    def embed_query(self, text: str) -> QueryEmbedding:
        # The token count comes from the tokenization the model runs on anyway: no extra work.
        vectors, tokens = self._run_counted([text])
        return QueryEmbedding(vectors[0], fits_window(int(tokens[0]), self._max_len))

    def embed_documents(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        return self._encode(texts, batch_size=batch_size)


def _open_tokenizer(model_dir: Path, max_len: int) -> Any:
    """The model's fast tokenizer straight from its tokenizer.json (special tokens added by its
    post-processor, truncated to `max_len` with them counted, as transformers' tokenizer does):
    importing transformers for it cost a build or a server start about 4 s (BENCHMARKS.md,
    "Indexing at the host's speed", "On a quiet host"). A folder without one loads through transformers."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(model_dir), **load_options(model_dir))
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_len)
    return tokenizer


class _Gate:
    """At most `limit()` holders at once (at least one); the limit is read as each one enters."""

    def __init__(self, limit: Callable[[], int]) -> None:
        self._limit = limit
        self._active = 0
        self._changed = threading.Condition()

    def __enter__(self) -> None:
        with self._changed:
            # Re-read now and then: the limit may rise while every holder is busy.
            while self._active >= max(1, self._limit()):
                self._changed.wait(0.2)
            self._active += 1

    def __exit__(self, *_: object) -> None:
        with self._changed:
            self._active -= 1
            self._changed.notify()
