"""Tuning an index's models to its corpus, offline, each run publishing a new index version.

`embedder.py` is `indexer tune` (mine pairs and hard negatives, train, re-embed, fit, publish the
bi-encoder), with its training in `embedder_model.py` and the version it publishes built by
`publish.py`; `reranker.py` is `indexer tune-reranker` (mine groups, train, export, fit the blend,
publish the cross-encoder), with its model and training in `reranker_model.py`. Both train through
the resumable, checkpointed loop in `training.py` and read, split and score labelled queries with
`evaluation.py` (which owns the split salt and the served default fusion weight they share).
`reader.py` is `indexer tune-reader` (train a span head on a SQuAD-format folder, export it, measure it
on a held-out one, write a reader folder; no index version), with its data in `reader_data.py`,
training and export in `reader_model.py` and held-out figures in `reader_eval.py`.
`tune-generator` trains a LoRA adapter for the generator (no index version): its data made through
Query's own path in `generator_data.py`, its training (torch, transformers and peft only) in
`generator_model.py`, answers scored by `generator_figures.py`.
`commands.py` registers the four CLI commands on the indexer's typer app.
"""
