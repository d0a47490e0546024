"""How the client commands print what the server sent: passages, the reader's span, the final event."""

from __future__ import annotations

from typing import Any


def snippet(text: str, width: int = 100) -> str:
    """The passage's start on one line, cut at a word near `width` characters."""
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    cut = flat[:width].rsplit(" ", 1)[0]
    return cut + " ..."


def print_retrieval(r: Any) -> None:
    print(f"retrieved {len(r.passages)} passages in {r.timings.retrieval_total_ms:.1f} ms (index v{r.index_version}):")
    for p in r.passages:
        print(f"  [{p.rank}] {p.doc_id}  score={p.score:.3f}  {p.title}")
    shown = r.passages[r.support.evidence_passage] if r.support.evidence_passage < len(r.passages) else None
    if shown is not None and shown.HasField("highlight"):
        # Evidence, shown before the first token; the answer follows.
        h = shown.highlight
        print(f"evidence [{shown.rank}]: {snippet(shown.text[h.start : h.end], 160)}")
    if r.HasField("answer"):
        print_span(r.answer, list(r.passages), r.timings.reader_ms)
    if r.support.low:
        print("(low support: the documents may not answer this)")
    print("answer: ", end="", flush=True)


def print_span(span: Any, passages: list[Any], reader_ms: float) -> None:
    """The reader's span and the sentence holding it, or that it found none."""
    if span is None or span.passage >= len(passages):
        print(f"reader ({reader_ms:.0f} ms): no answer span in the passages it read")
        return
    passage = passages[span.passage]
    verdict = "" if span.answers else " (below its threshold: the documents may not say)"
    sentence = snippet(passage.text[span.sentence_start : span.sentence_end], 160)
    print(f'reader ({reader_ms:.0f} ms): "{span.text}" in [{passage.rank}]{verdict}')
    print(f"  {sentence}")


def print_final(f: Any, client_seconds: float) -> None:
    t = f.timings
    print()
    if f.declined:
        print("declined: the retrieved documents do not contain the answer")
    if f.HasField("decline_evidence"):
        e = f.decline_evidence
        signals = ", ".join(f"{name} {value:.3f}" for name, value in sorted(e.signals.items()))
        print(f"decline: score {e.score:.3f} >= threshold {e.threshold:.3f} ({signals})")
    print_citations(f)
    print(
        f"-- ttft {t.ttft_ms:.0f} ms, {t.time_per_output_token_ms:.1f} ms/token, "
        f"total {t.total_ms:.0f} ms (client saw {1000 * client_seconds:.0f} ms); "
        f"tokens: {f.usage.prompt_tokens} prompt "
        f"({f.usage.prefix_cache_hit_tokens} from prefix cache; passages "
        f"{f.usage.context_tokens} of {f.usage.context_tokens_full}), "
        f"{f.usage.completion_tokens} completion; finish: {f.finish_reason}"
        + ("; from the answer cache" if f.answer_cache_hit else "")
    )


def where_of(location: Any) -> str:
    """A source location in words: the document, its page, its section path, the characters."""
    parts = [location.locator]
    if location.page:
        parts.append(f"page {location.page}")
    if location.section:
        parts.append(" > ".join(location.section))
    return ", ".join(parts)


def print_citations(f: Any) -> None:
    """Each citation, located in its source, and whether its passage holds what it supports."""
    for c in f.citations:
        where = where_of(c.location) if c.HasField("location") else f"{c.doc_id} (no location: an older index)"
        verdict = "" if c.supported else "  (NOT supported by this passage)"
        print(f"cited [{c.marker}] {where}, chars {c.quote_start}-{c.quote_end}{verdict}")
        print(f"  {snippet(c.quote, 160)}")
    if f.unsupported:
        print("unsupported: some of this answer is not found in the retrieved passages")
