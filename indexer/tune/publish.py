"""Publish a tuned bi-encoder with the index version it made: ONNX int8 export, checksums,
the corpus re-embedded, HNSW rebuilt, the rest of the version (chunks, documents, BM25) carried
over, the fusion weight fitted, then the indexer's publish-and-verify path."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from indexer.chunking import embedding_text
from ragserve.digests import sha256_file
from ragserve.embed.onnx_backend import INT8_FILE, OnnxEmbedder, export_onnx
from ragserve.embed.tuned import TUNED_DIR, TUNED_ONNX, tuned_model_id
from ragserve.index.format import HNSW_FILE, MANIFEST, VECTORS_FILE, Manifest, new_build_dir
from ragserve.index.hnsw import HnswIndex
from ragserve.index.hnsw_build import build_hnsw
from ragserve.rerank.tuned import TUNED_DIR as TUNED_RERANKER_DIR

# What the tokenizer and the ONNX embedder read from a model folder (whichever exist).
_MODEL_FILES = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)


def export_tuned(model_dir: Path, target: Path, max_seq_length: int) -> Path:
    """`model_dir` (a saved sentence-transformers model) as ONNX int8 plus its tokenizer files in
    `target` (the version's embedder/ folder) and the token window the ONNX embedder cuts queries
    at; returns the ONNX file."""
    target.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix=".export-", dir=target.parent) as tmp:
        onnx = export_onnx(model_dir, Path(tmp), quantize=True)
        shutil.copyfile(onnx, target / INT8_FILE)
    for name in _MODEL_FILES:
        if (model_dir / name).is_file():
            shutil.copyfile(model_dir / name, target / name)
    (target / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))
    return target / INT8_FILE


def embed_chunks(embedder: OnnxEmbedder, index: HnswIndex, batch_size: int, progress: bool) -> np.ndarray:
    """Every chunk of the version, as the indexer embeds it (`embedding_text`), in row order."""
    texts = [embedding_text(c) for c in index.chunks]
    out = np.empty((len(texts), embedder.dim), dtype=np.float32)
    group = max(1, batch_size * 16)
    bar = tqdm(total=len(texts), unit="chunk", desc="re-embed", disable=not progress)
    for start in range(0, len(texts), group):
        out[start : start + group] = embedder.embed_documents(texts[start : start + group], batch_size)
        bar.update(min(group, len(texts) - start))
    bar.close()
    return out


def _carry_over(source: Path, build: Path, manifest: Manifest) -> dict[str, str]:
    """Copy every listed file the re-embedding does not change (chunks, documents, BM25). A tuned
    cross-encoder is left behind: its blend weight was fitted on the old fused order."""
    kept: dict[str, str] = {}
    for name, digest in manifest.files.items():
        if name in (HNSW_FILE, VECTORS_FILE) or name.startswith((f"{TUNED_DIR}/", f"{TUNED_RERANKER_DIR}/")):
            continue
        (build / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / name, build / name)
        kept[name] = digest
    return kept


def build_tuned_version(
    root: Path,
    current: HnswIndex,
    model_dir: Path,
    base: str,
    max_seq_length: int = 256,
    batch_size: int = 16,
    progress: bool = True,
) -> tuple[Path, Manifest]:
    """A complete, not yet published version in a build folder: the tuned model, the corpus
    re-embedded with it, a provisional manifest (the caller adds `tuning`, then publishes)."""
    build = new_build_dir(root)
    onnx = export_tuned(model_dir, build / TUNED_DIR, max_seq_length)
    embedder = OnnxEmbedder.from_export(onnx, build / TUNED_DIR, "tuning", threads=0, spin=True)
    matrix = embed_chunks(embedder, current, batch_size, progress)
    ef_search = build_hnsw(matrix, build / HNSW_FILE)
    np.save(build / VECTORS_FILE, matrix, allow_pickle=False)
    files = _carry_over(current.folder, build, current.manifest)
    for path in sorted((build / TUNED_DIR).iterdir()):
        files[f"{TUNED_DIR}/{path.name}"] = sha256_file(path)
    for name in (HNSW_FILE, VECTORS_FILE):
        files[name] = sha256_file(build / name)
    spec = {"dir": TUNED_DIR, "onnx": TUNED_ONNX, "base": base, "max_seq_length": embedder.max_seq_length}
    manifest = replace(
        current.manifest,
        version=0,  # set by the caller when publishing
        embedder_id=tuned_model_id(base, files[TUNED_ONNX]),
        dim=int(matrix.shape[1]),
        files=files,
        embedder_backend="onnx-int8",
        tuned_embedder=spec,
        tuned_reranker={},
        tuning={},
        hnsw={**current.manifest.hnsw, "ef_search": ef_search},
    )
    (build / MANIFEST).write_text(manifest.to_json())  # provisional: lets the build be loaded and scored
    return build, manifest
