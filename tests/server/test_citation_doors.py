"""Citations on every door: a marker `[n]` the generator writes becomes its own event right after
the token that closes it, before the tokens that follow and the final event; its quote is the
source document's text at its stated range; an answer no passage holds is flagged unsupported.
In process, over the real front, embedder and index, with a generator fake whose words are set
per test (tests/server/doors.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from indexer.build import build_index
from indexer.metadata import split_front_matter
from ragserve.embed.torch_backend import SentenceTransformerEmbedder
from ragserve.v1 import rag_pb2 as pb
from ragserve.v1 import rag_pb2_grpc as pb_grpc
from tests.fakes import FakeGenerator
from tests.helpers import paged_pdf
from tests.server.doors import SECRET_DOC, Doors, call_tool, serving_doors

SUPPORTED = ["The launch ", "code is ", "4417 [", "1", "]", " for", " Project Zephyr", "."]
INVENTED = ["It was ", "painted purple in 1887 ", "[1]", "."]


@pytest.fixture(scope="module")
def cite_doors(
    access_index: Path, tmp_path_factory: pytest.TempPathFactory, embedder: SentenceTransformerEmbedder
) -> Iterator[Doors]:
    key_file = tmp_path_factory.mktemp("cite-keys") / "keys"
    with serving_doors(access_index, embedder, key_file, FakeGenerator(words=SUPPORTED)) as both:
        yield both


def _source_text(access_index: Path, doc_id: str) -> str:
    """The document's extracted text, as the indexer read it (front matter split off)."""
    folder = access_index.parent / "docs"
    return split_front_matter((folder / doc_id).read_text())[1]


def _grpc_events(doors: Doors, question: str, caller: str = "alice") -> list[pb.QueryEvent]:
    metadata = [("authorization", f"Bearer {doors.keys[caller]}")]
    with grpc.insecure_channel(doors.grpc_target) as channel:
        return list(
            pb_grpc.RagServiceStub(channel).Query(pb.QueryRequest(query=question), metadata=metadata, timeout=30)
        )


def test_grpc_streams_each_citation_after_its_marker_located_in_its_source(
    cite_doors: Doors, access_index: Path
) -> None:
    cite_doors.generator.words = SUPPORTED
    events = _grpc_events(cite_doors, "What is the launch code of Project Zephyr?")
    kinds = [e.WhichOneof("event") for e in events]
    at = kinds.index("citation")
    tokens_before = "".join(e.token.text for e in events[:at] if e.HasField("token"))
    assert tokens_before.endswith("4417 [1]")  # right after the token closing the marker ...
    assert kinds[at + 1] == "token" and kinds[-1] == "final"  # ... before the tokens that follow
    citation = events[at].citation
    passages = events[0].retrieval.passages
    assert citation.marker == 1 and citation.chunk_id == passages[0].chunk_id and citation.doc_id == SECRET_DOC
    assert tokens_before[citation.answer_start : citation.answer_end] == "The launch code is 4417"
    assert citation.supported and citation.location.locator == SECRET_DOC
    source = _source_text(access_index, citation.doc_id)
    assert source[citation.quote_start : citation.quote_end] == citation.quote
    assert "4417" in citation.quote
    assert passages[0].location.locator == SECRET_DOC
    final = events[-1].final
    assert list(final.citations) == [citation] and not final.unsupported


def test_an_answer_no_passage_holds_is_flagged_unsupported_on_every_door(cite_doors: Doors) -> None:
    cite_doors.generator.words = INVENTED
    question = "What colour was Project Zephyr's balloon?"
    final = _grpc_events(cite_doors, question)[-1].final
    assert final.unsupported and not final.citations[0].supported
    body = _chat(cite_doors, "And which colour was the Zephyr balloon?", stream=False)
    assert body["ragserve"]["final"]["unsupported"] is True
    result = asyncio.run(
        call_tool(cite_doors.http_url, f"Bearer {cite_doors.keys['alice']}", "answer", {"question": "Zephyr colour?"})
    )
    structured = result.structured_content
    assert structured["unsupported"] is True and structured["citations"][0]["supported"] is False


def _chat(doors: Doors, question: str, stream: bool) -> dict:
    body = {"model": "ragserve", "messages": [{"role": "user", "content": question}], "stream": stream}
    headers = {"authorization": f"Bearer {doors.keys['alice']}"}
    reply = httpx.post(f"{doors.http_url}/v1/chat/completions", json=body, headers=headers, timeout=30)
    assert reply.status_code == 200, reply.text
    if not stream:
        return reply.json()
    chunks = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: {")]
    return {"chunks": chunks}


def test_the_openai_door_streams_citations_as_annotations_before_the_finish(cite_doors: Doors) -> None:
    cite_doors.generator.words = SUPPORTED
    chunks = _chat(cite_doors, "Tell me the launch code of Project Zephyr.", stream=True)["chunks"]
    cited = [n for n, c in enumerate(chunks) if c["choices"] and "annotations" in c["choices"][0]["delta"]]
    finished = next(n for n, c in enumerate(chunks) if c["choices"] and c["choices"][0]["finish_reason"])
    later_text = [n for n, c in enumerate(chunks) if c["choices"] and c["choices"][0]["delta"].get("content") == " for"]
    assert cited and cited[0] < later_text[0] < finished
    chunk = chunks[cited[0]]
    annotation = chunk["choices"][0]["delta"]["annotations"][0]
    assert annotation["type"] == "url_citation" and annotation["url_citation"]["url"] == SECRET_DOC
    assert chunk["ragserve"]["citation"]["quote"] and chunk["ragserve"]["citation"]["supported"] is True
    whole = _chat(cite_doors, "Which launch code does Project Zephyr use?", stream=False)
    message = whole["choices"][0]["message"]
    span = message["annotations"][0]["url_citation"]
    assert message["content"][span["start_index"] : span["end_index"]] == "The launch code is 4417"
    assert whole["ragserve"]["final"]["citations"][0]["doc_id"] == SECRET_DOC


def test_the_mcp_answer_gives_each_citation_located_with_its_span(cite_doors: Doors, access_index: Path) -> None:
    cite_doors.generator.words = SUPPORTED
    arguments = {"question": "Project Zephyr's launch code, please?"}
    result = asyncio.run(call_tool(cite_doors.http_url, f"Bearer {cite_doors.keys['alice']}", "answer", arguments))
    structured = result.structured_content
    citation = structured["citations"][0]
    assert structured["answer"][citation["answer_start"] : citation["answer_end"]] == "The launch code is 4417"
    assert citation["location"]["locator"] == SECRET_DOC and citation["supported"] is True
    source = _source_text(access_index, citation["doc_id"])
    assert source[citation["quote_start"] : citation["quote_end"]] == citation["quote"]


def _source(doors: Doors, caller: str, **fields: object) -> pb.SourceResponse:
    metadata = [("authorization", f"Bearer {doors.keys[caller]}")]
    with grpc.insecure_channel(doors.grpc_target) as channel:
        return pb_grpc.RagServiceStub(channel).Source(pb.SourceRequest(**fields), metadata=metadata, timeout=30)


def test_click_to_source_shows_the_quote_in_its_document_within_the_grant(
    cite_doors: Doors, access_index: Path
) -> None:
    cite_doors.generator.words = SUPPORTED
    events = _grpc_events(cite_doors, "Launch code of the Zephyr project?")
    citation = next(e.citation for e in events if e.HasField("citation"))
    asked = {"chunk_id": citation.chunk_id, "start": citation.quote_start, "end": citation.quote_end}
    view = _source(cite_doors, "alice", **asked)
    assert view.found and view.doc_id == SECRET_DOC and view.location.locator == SECRET_DOC
    quote = view.text[view.quote_start - view.text_start : view.quote_end - view.text_start]
    assert quote == citation.quote
    source = _source_text(access_index, SECRET_DOC)
    assert source[view.text_start : view.text_start + len(view.text)] == view.text
    # Bob may not read the secret document: his answer is an unknown id's, word for word.
    assert _source(cite_doors, "bob", **asked) == _source(cite_doors, "bob", chunk_id="no-such.md#0")
    assert not _source(cite_doors, "bob", **asked).found
    with pytest.raises(grpc.RpcError) as refused:
        _source(cite_doors, "alice", chunk_id=citation.chunk_id, start=10_000, end=10_001)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    arguments = {"chunk_id": citation.chunk_id, "quote_start": citation.quote_start, "quote_end": citation.quote_end}
    result = asyncio.run(call_tool(cite_doors.http_url, f"Bearer {cite_doors.keys['alice']}", "fetch", arguments))
    assert f">>> {citation.quote} <<<" in result.content[0].text
    assert result.structured_content["location"]["locator"] == SECRET_DOC


PDF_PAGES = [
    "Glaciers carve deep valleys over thousands of years of slow movement.",
    "Rivers carry sediment from the mountains down to the plains and the sea.",
    "Leaves are green because they hold chlorophyll. It absorbs red and blue light.",
]
LEAVES = ["Leaves ", "hold ", "chlorophyll ", "[1]", "."]


@pytest.fixture(scope="module")
def pdf_doors(tmp_path_factory: pytest.TempPathFactory, embedder: SentenceTransformerEmbedder) -> Iterator[Doors]:
    """One public three-page PDF, one chunk: the cited sentence is on page 3, past two page breaks
    inside the chunk (each citation names its quote's page, not its chunk's first)."""
    root = tmp_path_factory.mktemp("pdf-doors")
    (root / "docs").mkdir()
    (root / "docs" / "nature.pdf").write_bytes(paged_pdf(PDF_PAGES))
    (root / "docs" / "nature.pdf.meta.json").write_text('{"groups": ["public"]}')
    build_index(root / "docs", root / "idx", embedder, progress=False)
    with serving_doors(root / "idx", embedder, root / "keys", FakeGenerator(words=LEAVES)) as both:
        yield both


def test_a_pdf_citation_names_its_quotes_page_on_every_door(pdf_doors: Doors) -> None:
    events = _grpc_events(pdf_doors, "Why are leaves green?", caller="bob")
    citation = next(e.citation for e in events if e.HasField("citation"))
    assert citation.doc_id == "nature.pdf" and citation.quote.startswith("Leaves are green")
    assert citation.location.page == 3 and citation.location.start == 0  # the chunk starts on page 1
    on_page = citation.quote_start - citation.location.page_start
    assert PDF_PAGES[2][on_page : on_page + len(citation.quote)] == citation.quote
    body = _chat(pdf_doors, "Why are leaves green?", stream=False)
    (cited,) = body["ragserve"]["final"]["citations"]
    assert cited["location"]["page"] == 3 and int(cited["location"]["page_start"]) == citation.location.page_start
    bearer = f"Bearer {pdf_doors.keys['bob']}"
    result = asyncio.run(call_tool(pdf_doors.http_url, bearer, "answer", {"question": "Why are leaves green?"}))
    (mcp_cited,) = result.structured_content["citations"]
    assert mcp_cited["location"]["page"] == 3 and mcp_cited["location"]["page_start"] == citation.location.page_start
    asked = {"chunk_id": citation.chunk_id, "start": citation.quote_start, "end": citation.quote_end}
    view = _source(pdf_doors, "bob", **asked)
    assert view.found and view.location.page == 3 and view.location.page_start == citation.location.page_start
