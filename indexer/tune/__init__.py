"""Tuning an index's models to its corpus, offline, each run publishing a new index version.

`embedder.py` is `indexer tune` (mine pairs and hard negatives, train, re-embed, fit, publish the
bi-encoder), with its training in `embedder_model.py` and the version it publishes built by
`publish.py`; `reranker.py` is `indexer tune-reranker` (mine groups, train, export, fit the blend,
publish the cross-encoder), with its model and training in `reranker_model.py`. Both train through
the resumable, checkpointed loop in `training.py` and read, split and score labelled queries with
`evaluation.py` (which owns the split salt and the served default fusion weight they share).
`commands.py` registers the two CLI commands on the indexer's typer app.
"""
