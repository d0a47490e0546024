"""What the MCP door's tools answer: structured content (for agents that read it) and a text
rendering of the same (for clients that read only text)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from mcp.types import CallToolResult, TextContent

from ragserve.events import Citation, FinalSummary, LateAnswer, QueryEvent, TokenDelta
from ragserve.request.source_view import SourceView
from ragserve.types import Chunk, Passage, RetrievalResult


def _result(structured: dict[str, Any], text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured)


def _highlight(passage: Passage) -> str:
    found = passage.highlight
    return passage.chunk.text[found.start : found.end] if found is not None else ""


def passage_of(passage: Passage) -> dict[str, Any]:
    chunk = passage.chunk
    return {
        "doc_id": chunk.doc_id,
        "chunk_id": chunk.chunk_id,
        "title": chunk.title,
        "text": chunk.text,
        "score": round(float(passage.score), 6),
        "highlight": _highlight(passage),
    }


def _passages_text(passages: Sequence[dict[str, Any]]) -> str:
    return "\n\n".join(
        f"[{n}] {p['title'] or p['doc_id']} ({p['chunk_id']})\n{p['text']}" for n, p in enumerate(passages, 1)
    )


def search_result(result: RetrievalResult) -> CallToolResult:
    passages = [passage_of(p) for p in result.passages]
    text = _passages_text(passages) or "No passage matched."
    return _result({"passages": passages, "index_version": result.index_version}, text)


def answer_result(events: Sequence[QueryEvent]) -> CallToolResult:
    """The answer's text, its citations resolved to the passages it cites (with the sentence each
    quotes), `declined`, and the passages shown to the model."""
    text = "".join(e.text for e in events if isinstance(e, TokenDelta))
    retrieval = next((e for e in events if isinstance(e, RetrievalResult)), None)
    final = next((e for e in events if isinstance(e, FinalSummary)), None)
    shown = list(retrieval.passages) if retrieval is not None else []
    late = next((e.answer for e in events if isinstance(e, LateAnswer) and e.answer is not None), None)
    span = late or (retrieval.answer if retrieval is not None else None)
    lead = len(text) - len(text.lstrip())  # the answer is given stripped: its offsets shift
    citations = [_citation_of(e, lead) for e in events if isinstance(e, Citation)]
    structured = {
        "answer": text.strip(),
        "declined": bool(final.declined) if final is not None else False,
        "decline_evidence": _decline_evidence(final),
        "citations": citations,
        "unsupported": bool(final.unsupported) if final is not None else False,
        "reader_span": span.text if span is not None else "",
        "passages": [passage_of(p) for p in shown],
        "index_version": retrieval.index_version if retrieval is not None else "",
    }
    sources = "\n".join(f"[{c['n']}] {c['title'] or c['doc_id']}: {c['quote']}" for c in citations)
    if structured["unsupported"]:
        sources += "\nNote: some of this answer is not found in the passages it cites."
    return _result(structured, text.strip() + (f"\n\nSources:\n{sources}" if sources else ""))


def _decline_evidence(final: FinalSummary | None) -> dict[str, Any] | None:
    """Why the server declined before the generator (None: it did not)."""
    evidence = final.decline_evidence if final is not None else None
    if evidence is None:
        return None
    return {"score": evidence.score, "threshold": evidence.threshold, "signals": dict(evidence.signals)}


def _citation_of(citation: Citation, lead: int) -> dict[str, Any]:
    """One citation as streamed: the answer span it supports, where its quote is in the source."""
    chunk, where = citation.chunk, citation.location
    return {
        "n": citation.marker,
        "doc_id": chunk.doc_id,
        "chunk_id": chunk.chunk_id,
        "title": chunk.title,
        "quote": citation.quote,
        "quote_start": citation.quote_start,
        "quote_end": citation.quote_end,
        "answer_start": max(citation.answer_start - lead, 0),
        "answer_end": max(citation.answer_end - lead, 0),
        "location": where.record() if where is not None else None,
        "supported": citation.supported,
    }


def fetch_result(chunks: Sequence[Chunk], version: str) -> CallToolResult:
    found = [
        {"doc_id": c.doc_id, "chunk_id": c.chunk_id, "title": c.title, "text": c.text, "metadata": c.metadata}
        for c in chunks
    ]
    text = "\n\n".join(f"{c['title'] or c['doc_id']} ({c['chunk_id']})\n{c['text']}" for c in found)
    return _result({"found": bool(found), "chunks": found, "index_version": version}, text or "Not found.")


def source_result(view: SourceView | None, version: str) -> CallToolResult:
    """A citation's quote in its document: the text around it, the quote marked >>> <<<."""
    if view is None:
        return _result({"found": False, "index_version": version}, "Not found.")
    before, quote, after = view.marked
    where = view.location
    structured = {
        "found": True,
        "doc_id": view.chunk.doc_id,
        "chunk_id": view.chunk.chunk_id,
        "title": view.chunk.title,
        "location": where.record() if where is not None else None,
        "text": view.text,
        "text_start": view.text_start,
        "quote_start": view.quote_start,
        "quote_end": view.quote_end,
        "index_version": version,
    }
    return _result(structured, f"{before}>>> {quote} <<<{after}")


def fields_result(schema: Mapping[str, str]) -> CallToolResult:
    fields = dict(schema)
    text = json.dumps(fields) if fields else "No filterable fields: this index was built without front matter."
    return _result({"fields": fields}, text)
