"""The request path, over the pluggable parts' Protocols only (no gRPC, torch or vLLM here).

pipeline.py   RagPipeline: retrieve and query under one Deadline; owns the parts' lifecycle
serving.py    ServingVersion: one index version with the models it serves with (swapped whole)
search.py     search and rerank, the budgeted middle of the path
caches.py     the retrieval and answer caches as the path sees them (keys, bounded lookups, replay)
context.py    passages cut to the sentences that answer, within the token budget
answer.py     one answer streamed from a Generator, with what it cost
"""
