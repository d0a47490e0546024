"""The default query embedder, ONNX Runtime over the bundled all-MiniLM-L6-v2 (int8), directly."""

from __future__ import annotations

import numpy as np
import pytest

from ragserve.config import DEFAULT_EMBEDDER
from ragserve.embed.onnx_backend import OnnxEmbedder
from ragserve.embed.torch_backend import SentenceTransformerEmbedder


@pytest.fixture(scope="module")
def onnx_embedder() -> OnnxEmbedder:
    return OnnxEmbedder(quantize=True, threads=1, spin=False)


def test_vectors_are_unit_length_of_the_models_width(onnx_embedder: OnnxEmbedder) -> None:
    vectors = onnx_embedder.embed_queries(["tides and the moon", "the TCP handshake", ""])
    assert vectors.shape == (3, onnx_embedder.dim) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert onnx_embedder.output_width() == onnx_embedder.dim == 384
    assert onnx_embedder.model_id == DEFAULT_EMBEDDER


def test_meaning_orders_similarity(onnx_embedder: OnnxEmbedder) -> None:
    query, near, far = onnx_embedder.embed_queries(
        ["What pulls the ocean's tides?", "The moon's gravity causes tides.", "TCP opens with a three-way handshake."]
    )
    assert float(query @ near) > float(query @ far) + 0.2


def test_int8_agrees_with_the_torch_model_it_was_exported_from(
    onnx_embedder: OnnxEmbedder, embedder: SentenceTransformerEmbedder
) -> None:
    texts = ["Bloom filters trade memory for false positives.", "Penicillin was discovered by Alexander Fleming."]
    cosines = np.sum(onnx_embedder.embed_queries(texts) * embedder.embed_queries(texts), axis=1)
    assert (cosines > 0.97).all(), cosines


def test_a_query_longer_than_the_window_says_so(onnx_embedder: OnnxEmbedder) -> None:
    assert onnx_embedder.embed_query("a short question").fits_window
    long = onnx_embedder.embed_query(" ".join(["word"] * (onnx_embedder.max_seq_length + 10)))
    assert not long.fits_window and np.isclose(np.linalg.norm(long.vector), 1.0, atol=1e-5)


def test_documents_embed_in_batches_in_input_order(onnx_embedder: OnnxEmbedder) -> None:
    texts = [f"document number {i} " * (i % 5 + 1) for i in range(7)]
    batched = onnx_embedder.embed_documents(texts, batch_size=3)
    one_by_one = np.vstack([onnx_embedder.embed_queries([t]) for t in texts])
    # int8 activations are quantized per batch (and padding differs): close, not equal.
    cosines = np.sum(batched * one_by_one, axis=1)
    assert (cosines > 0.98).all(), cosines
