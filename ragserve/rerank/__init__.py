"""Cross-encoder reranking: a cheap tier over the fused candidates, a stronger tier over its best."""
