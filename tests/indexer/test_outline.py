"""Every chunk says where it stands in its source: its characters in the document's extracted text,
the PDF page (not always the first) and offset within it, the Markdown or HTML section path, and
the document's locator; the quote at a chunk's stated range is the text the chunk holds."""

from __future__ import annotations

from pathlib import Path

from indexer.chunking import ChunkingConfig, chunk_documents
from indexer.loaders import Document
from indexer.outline import Outline, markdown_headings
from indexer.sources import iter_source
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.request.citations import CitationTracker
from ragserve.types import Passage
from tests.helpers import paged_pdf

CONFIG = ChunkingConfig(size_tokens=24, overlap_tokens=4)


def _documents(folder: Path) -> dict[str, Document]:
    return {item.doc_id: item for item in iter_source(folder) if isinstance(item, Document)}


def _located(doc: Document, embedder: SentenceTransformerEmbedder) -> list:
    chunks = chunk_documents([doc], embedder.tokenizer, CONFIG)[0]
    for chunk in chunks:  # the chunk is its source's text at its stated range
        assert doc.text[chunk.start : chunk.end] == chunk.text
        assert chunk.location is not None
    return chunks


def test_a_pdf_chunk_names_its_page_and_where_it_starts_on_it(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    pages = [
        "Glaciers carve deep valleys over thousands of years of slow movement.",
        "",  # a blank page still counts in the numbering
        "Photosynthesis turns light into sugar inside the chloroplasts of leaves.",
        "Volcanic islands rise where magma breaks through the ocean floor crust.",
    ]
    (tmp_path / "nature.pdf").write_bytes(paged_pdf(pages))
    doc = _documents(tmp_path)["nature.pdf"]
    assert [number for number, _ in doc.outline.pages] == [1, 3, 4]
    chunks = _located(doc, embedder)
    for chunk in chunks:
        location = chunk.location
        page_text = pages[location.page - 1]
        on_page = chunk.start - location.page_start
        assert page_text[on_page : on_page + 12] == chunk.text[:12]
    third = next(c for c in chunks if "chloroplasts" in c.text[:60])
    assert third.location.page == 3 and third.location.locator == "nature.pdf"


def test_markdown_and_html_chunks_carry_their_section_path(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    filler = "Several ordinary words fill this paragraph so the window moves on. " * 3
    (tmp_path / "guide.md").write_text(
        "---\ntitle: Field guide\nurl: https://example.org/guide\n---\n"
        f"# Birds\n{filler}\n## Owls\nOwls hunt at night with silent feathers. {filler}\n"
        f"```\n# not a heading\n```\n# Fish\nSalmon swim upstream to spawn. {filler}\n"
    )
    (tmp_path / "page.html").write_text(
        f"<html><body><h1>Stars</h1><p>{filler}</p><h2>Red <em>giants</em></h2>"
        f"<p>Red giants swell as their hydrogen runs out. {filler}</p></body></html>"
    )
    docs = _documents(tmp_path)
    guide, page = docs["guide.md"], docs["page.html"]
    expected = {
        "guide.md": [("# Birds", ("Birds",)), ("## Owls", ("Birds", "Owls")), ("# Fish", ("Fish",))],
        "page.html": [("Stars", ("Stars",)), ("Red giants", ("Stars", "Red giants"))],
    }
    for doc in (guide, page):
        chunks = _located(doc, embedder)
        for chunk in chunks:
            # The section in force at the chunk's first character: the last heading before it.
            at = [section for heading, section in expected[doc.doc_id] if doc.text.index(heading) <= chunk.start]
            assert chunk.location.section == (at[-1] if at else ())
        assert {c.location.section for c in chunks} >= {section for _, section in expected[doc.doc_id][1:]}
    assert _located(guide, embedder)[0].location.locator == "https://example.org/guide"  # a URL in its metadata
    assert _located(page, embedder)[0].location.locator == "page.html"


def test_outlines_nest_and_survive_their_record() -> None:
    text = "# A\nx\n## B\ny\n### C\nz\n## D\nw\n"
    outline = Outline(headings=markdown_headings(text), locator="doc.md")
    assert outline.locate(text.index("z"), len(text), {}, "").section == ("A", "B", "C")
    assert outline.locate(text.index("w"), len(text), {}, "").section == ("A", "D")
    assert outline.locate(0, 1, {"url": "javascript:alert(1)"}, "").locator == "doc.md"  # only http(s) URLs
    assert Outline.of_record(outline.to_record()) == outline
    assert Outline.of_record(None) == Outline()


def test_a_citation_of_a_later_pdf_page_quotes_the_source_at_its_range_on_that_page(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    """The chain a reader clicks through: a streamed `[n]` marker becomes a citation whose quote is
    the document's own text at the stated range, on the page the chunk names (the third, here)."""
    pages = [
        "Glaciers carve deep valleys over thousands of years of slow movement.",
        "Rivers carry sediment from the mountains down to the plains and the sea.",
        "Leaves are green because they hold chlorophyll, which absorbs red and blue light well. "
        "Photosynthesis turns that light, water and carbon dioxide into sugar and oxygen for the plant. "
        "It happens inside the chloroplasts of leaves.",
    ]
    (tmp_path / "nature.pdf").write_bytes(paged_pdf(pages))
    doc = _documents(tmp_path)["nature.pdf"]
    # A chunk that starts on the third page (a quote past a page break inside its chunk: below).
    cited = next(c for c in _located(doc, embedder) if c.location.page == 3 and "chloroplasts" in c.text)
    tracker = CitationTracker([Passage(cited, 1.0, 1)])
    tracker.feed("Sugar is made inside the chloroplasts of leaves [1].")
    (citation,) = tracker.citations
    assert citation.supported and citation.chunk.location is not None
    # The quoted sentence, as much of it as the (24-token) chunk holds.
    assert citation.quote.startswith("It happens inside the chloroplasts")
    assert doc.text[citation.quote_start : citation.quote_end] == citation.quote
    location = citation.location
    assert location is not None and location.page == 3 and location.locator == "nature.pdf"
    on_page = citation.quote_start - location.page_start
    assert pages[2][on_page : on_page + len(citation.quote)] == citation.quote


def test_a_quote_past_a_page_break_inside_its_chunk_names_its_own_page(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    """A chunk that starts on page 2 and runs into page 3 keeps page 3's first character: a quote
    from page 3 is located on page 3, at its offset there; the chunk itself still names page 2."""
    pages = [
        "Glaciers carve deep valleys over thousands of years of slow movement.",
        "Rivers carry sediment down to the sea.",
        "Leaves are green because they hold chlorophyll. Photosynthesis turns light into sugar for the plant.",
    ]
    (tmp_path / "nature.pdf").write_bytes(paged_pdf(pages))
    doc = _documents(tmp_path)["nature.pdf"]
    cited = next(c for c in _located(doc, embedder) if c.location.page == 2 and "chlorophyll" in c.text)
    assert [page for page, _ in cited.location.page_breaks] == [3]
    tracker = CitationTracker([Passage(cited, 1.0, 1)])
    tracker.feed("Leaves hold chlorophyll [1].")
    (citation,) = tracker.citations
    assert citation.quote.startswith("Leaves are green") and citation.chunk.location.page == 2
    location = citation.location
    assert location is not None and location.page == 3 and not location.page_breaks
    on_page = citation.quote_start - location.page_start
    assert pages[2][on_page : on_page + len(citation.quote)] == citation.quote
    # A quote on the chunk's first page keeps that page.
    first_page = cited.location.at(cited.start)
    assert (first_page.page, first_page.page_start) == (2, cited.location.page_start)
