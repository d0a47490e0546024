"""Every message, enum, field and enum value of rag.proto carries a comment directly above it.

The .proto is the API's reference (docs/api.md says so): a field without a comment is a field whose
meaning, unit or default a client has to guess. The check reads the .proto text: a declaration line
inside a message, enum or oneof must follow a `//` comment line (the last line of a comment block).
"""

from __future__ import annotations

import re
from pathlib import Path

PROTO = Path(__file__).resolve().parent.parent / "protos" / "ragserve" / "v1" / "rag.proto"

# A field (`optional`/`repeated` allowed, a map too), or an enum value: `NAME = 3;`.
_FIELD = re.compile(r"^(?:(?:optional|repeated)\s+)?[\w.<>, ]+\s+\w+\s*=\s*\d+\s*(?:\[.*\])?\s*;")
_ENUM_VALUE = re.compile(r"^[A-Z][A-Z0-9_]*\s*=\s*-?\d+\s*(?:\[.*\])?\s*;")
_BLOCK = re.compile(r"^(message|enum|oneof)\s+(\w+)\s*\{")


def uncommented(text: str) -> list[str]:
    """The declarations with no comment line directly above them, as "line N: text"."""
    missing: list[str] = []
    previous = ""
    depth = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        block = _BLOCK.match(line)
        declares = bool(block) and block.group(1) in ("message", "enum")
        declares = declares or (depth > 0 and bool(_FIELD.match(line) or _ENUM_VALUE.match(line)))
        if declares and not previous.startswith("//"):
            missing.append(f"line {number}: {line}")
        depth += line.count("{") - line.count("}")
        if line:
            previous = line
    return missing


def test_every_declaration_in_the_proto_is_commented() -> None:
    missing = uncommented(PROTO.read_text())
    assert not missing, "rag.proto declarations without a comment line above them:\n" + "\n".join(missing)


def test_the_check_sees_uncommented_fields_and_values() -> None:
    text = """
// A.
message A {
  // One.
  int32 one = 1;
  repeated string two = 2;
  oneof pick {
    // Three.
    B three = 3;
    C four = 4;
  }
}

enum E {
  // Zero.
  E_ZERO = 0;
  E_ONE = 1;
}

message Empty {}
"""
    assert uncommented(text) == [
        "line 6: repeated string two = 2;",
        "line 10: C four = 4;",
        "line 14: enum E {",
        "line 17: E_ONE = 1;",
        "line 20: message Empty {}",
    ]
