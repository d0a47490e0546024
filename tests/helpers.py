"""Small helpers shared by the tests (fixtures live in the conftest files, fakes in tests/fakes.py)."""

from __future__ import annotations

# The benchmarks hand out ports too; one function for both, kept under this name for the tests.
from benchmarks.harness import free_port as free_port


def pdf_file(objects: list[bytes], trailer: str = "") -> bytes:
    """A PDF of numbered `objects` (1 is the catalog) with a correct cross-reference table, so a
    strict reader accepts it; `trailer`: more trailer entries (e.g. "/Info 6 0 R")."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    for offset in offsets:
        out += f"{offset:010d} 00000 n \n".encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R {trailer}>>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def paged_pdf(pages: list[str]) -> bytes:
    """A valid PDF with one line of Helvetica text per page."""
    count = len(pages)
    kids = " ".join(f"{3 + 2 * n} 0 R" for n in range(count))
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", f"<< /Type /Pages /Kids [{kids}] /Count {count} >>".encode()]
    font = 3 + 2 * count
    for n, text in enumerate(pages):
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {4 + 2 * n} 0 R "
            f"/Resources << /Font << /F1 {font} 0 R >> >> >>".encode()
        )
        objects.append(b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream + b"\nendstream")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    return pdf_file(objects)
