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
