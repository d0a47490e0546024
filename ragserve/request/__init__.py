"""The request path, over the pluggable parts' Protocols only (no gRPC, torch or vLLM here).

pipeline.py       RagPipeline: retrieve and query under one Deadline; owns the parts' lifecycle
serving.py        ServingVersion: one index version with the models it serves with (swapped whole)
search.py         search and rerank, the budgeted middle of the path
model_threads.py  the threads model calls run on, interactive work first
caches.py         the retrieval and answer caches as the path sees them (keys, bounded lookups, replay)
sentences.py      a passage's sentences and their terms, worked out once per chunk text
evidence.py       each passage's best sentence and how well the passages support an answer
reading.py        the extractive reader's answer span, within its own budget
policy.py         how a Query's prompt is laid out and when the server declines to call the engine
context.py        passages cut to the sentences that answer, within the token budget
answer.py         one answer streamed from a Generator, with what it cost
reply.py          a Query's events once its prompt is with the engine (and answers given without it)
hot.py            which passages retrieval ranks first most often (warming's order)
warming.py        pre-filling the engine's prefix cache with the passages questions will reuse
"""
