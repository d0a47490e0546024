"""The peer's side of bench_peer.py: a Haystack pipeline as its tutorials build one (BM25 over an
in-memory store, a chat prompt with the passages, OpenAIChatGenerator streaming from a vLLM
OpenAI-compatible server), run in an interpreter that has `haystack-ai`. It imports nothing of
this repository.

    python benchmarks/peer_worker.py CORPUS_JSONL VLLM_URL MODEL MAX_TOKENS

Reads one question a line on stdin; writes one JSON line a question: its client TTFT (the pipeline
run to the first streamed token) and whole-answer ms, and the prompt tokens the server reports.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

TEMPLATE = """Given the following information, answer the question.

Context:
{% for document in documents %}
    {{ document.content }}
{% endfor %}

Question: {{ question }}
Answer:"""


def main() -> None:
    from haystack import Document, Pipeline
    from haystack.components.builders import ChatPromptBuilder
    from haystack.components.generators.chat import OpenAIChatGenerator
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever
    from haystack.dataclasses import ChatMessage
    from haystack.document_stores.in_memory import InMemoryDocumentStore
    from haystack.utils import Secret

    corpus, url, model, max_tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    store = InMemoryDocumentStore()
    with open(corpus) as f:
        store.write_documents([Document(content=row["text"], id=row["_id"]) for row in map(json.loads, f)])
    first: dict[str, float] = {}

    def on_chunk(chunk: Any) -> None:
        if chunk.content and "at" not in first:
            first["at"] = time.perf_counter()

    pipeline = Pipeline()
    pipeline.add_component("retriever", InMemoryBM25Retriever(document_store=store, top_k=5))
    pipeline.add_component(
        "prompt", ChatPromptBuilder(template=[ChatMessage.from_user(TEMPLATE)], required_variables="*")
    )
    generator = OpenAIChatGenerator(
        api_key=Secret.from_token("unused"),
        model=model,
        api_base_url=f"{url}/v1",
        streaming_callback=on_chunk,
        generation_kwargs={"max_tokens": max_tokens, "temperature": 0.0, "stream_options": {"include_usage": True}},
    )
    pipeline.add_component("llm", generator)
    pipeline.connect("retriever.documents", "prompt.documents")
    pipeline.connect("prompt.prompt", "llm.messages")
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        question = line.strip()
        first.clear()
        started = time.perf_counter()
        out = pipeline.run({"retriever": {"query": question}, "prompt": {"question": question}})
        done = time.perf_counter()
        usage = out["llm"]["replies"][0].meta.get("usage") or {}
        row = {"total_ms": (done - started) * 1000.0, "prompt_tokens": usage.get("prompt_tokens", 0)}
        if "at" in first:
            row["ttft_ms"] = (first["at"] - started) * 1000.0
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
