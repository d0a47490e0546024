"""Regenerate the committed Python stubs from protos/ with the pinned grpcio-tools.

python protos/generate.py            # write ragserve/v1/*_pb2*.py(i)
python protos/generate.py --out DIR  # write elsewhere (the drift test compares the two)
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import version
from pathlib import Path

# Stubs differ between grpcio-tools releases; pin the generator so regeneration is reproducible.
GRPCIO_TOOLS_VERSION = "1.85.1"
PROTO_ROOT = Path(__file__).resolve().parent
REPO_ROOT = PROTO_ROOT.parent
PROTOS = sorted(p.relative_to(PROTO_ROOT).as_posix() for p in (PROTO_ROOT / "ragserve").rglob("*.proto"))


def generate(out: Path) -> list[Path]:
    installed = version("grpcio-tools")
    if installed != GRPCIO_TOOLS_VERSION:
        raise SystemExit(f"grpcio-tools {GRPCIO_TOOLS_VERSION} required for stub generation, found {installed}")
    from grpc_tools import protoc

    out.mkdir(parents=True, exist_ok=True)
    # protoc's well-known types (google/protobuf/struct.proto) ship inside grpc_tools.
    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *PROTOS,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted((out / "ragserve").rglob("*_pb2*.py*"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO_ROOT)
    written = generate(parser.parse_args().out)
    print("\n".join(str(p) for p in written), file=sys.stderr)


if __name__ == "__main__":
    main()
