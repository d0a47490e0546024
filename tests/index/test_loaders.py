"""Text extraction from .html and .pdf files, and skip-and-report for bad ones."""

from __future__ import annotations

from pathlib import Path

from indexer.loaders import Document, Skipped, iter_source


def tiny_pdf(text: str, title: str = "") -> bytes:
    """A minimal valid one-page PDF with `text` in Helvetica (offsets computed, so pypdf reads it strictly)."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    info = f"<< /Title ({title}) >>".encode() if title else b"<< >>"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        info,
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    for offset in offsets:
        out += f"{offset:010d} 00000 n \n".encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R /Info 6 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def _by_id(folder: Path) -> dict[str, Document | Skipped]:
    return {(i.doc_id if isinstance(i, Document) else i.source): i for i in iter_source(folder)}


def test_html_text_and_title(tmp_path: Path) -> None:
    (tmp_path / "page.html").write_text(
        "<html><head><title>Coral reefs</title><style>p {color: red}</style>"
        "<script>var secret = 1;</script></head><body><h1>Reefs</h1>"
        "<p>Coral reefs are built by colonies of tiny animals.</p><p>They need warm, clear water.</p></body></html>"
    )
    doc = _by_id(tmp_path)["page.html"]
    assert isinstance(doc, Document)
    assert doc.title == "Coral reefs"
    assert "built by colonies of tiny animals" in doc.text and "warm, clear water" in doc.text
    assert "secret" not in doc.text and "color" not in doc.text


def test_pdf_text_and_title(tmp_path: Path) -> None:
    (tmp_path / "paper.pdf").write_bytes(tiny_pdf("Mitochondria produce most of the cell's ATP.", "Cell power"))
    doc = _by_id(tmp_path)["paper.pdf"]
    assert isinstance(doc, Document), doc
    assert doc.title == "Cell power"
    assert "Mitochondria produce most of the cell" in doc.text


def test_bad_files_are_skipped_with_a_reason(tmp_path: Path) -> None:
    (tmp_path / "good.txt").write_text("Good\nA fine document.")
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4\nthis is not really a pdf")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "empty.md").write_text("   \n")
    (tmp_path / "image.png").write_bytes(b"\x89PNG")
    (tmp_path / ".hidden.txt").write_text("not a document")
    items = _by_id(tmp_path)
    assert isinstance(items["good.txt"], Document)
    for name in ("broken.pdf", "latin1.txt", "empty.md"):
        assert isinstance(items[name], Skipped) and not items[name].ignored, name
    assert "not UTF-8" in items["latin1.txt"].reason  # type: ignore[union-attr]
    assert isinstance(items["image.png"], Skipped) and items["image.png"].ignored
    assert ".hidden.txt" not in items


def test_content_hash_tracks_text(tmp_path: Path) -> None:
    a = Document("x", "T", "one", "x")
    assert a.content_hash == Document("x", "T", "one", "y").content_hash
    assert a.content_hash != Document("x", "T", "two", "x").content_hash
