"""What a version's derived maps cost to load, one run, one index: its filter columns decoded from
every chunk (a version built before the indexer stored them) against read from the stored file
(FIELDS_FILE); and the chunk-id map warming needs after a reload, from the document records
against decoding every chunk.

    python benchmarks/bench_columns.py --index INDEX_ROOT [--field lang:keyword ...]

With no --field the version's own fields are used; a version without fields (the scale corpora)
gets a keyword field no chunk has, which still decodes every chunk, as a server does for it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.harness import cpu_name, load_avg  # noqa: E402
from ragserve.index.chunk_store import ChunkStore  # noqa: E402
from ragserve.index.format import CHUNKS_FILE, read_verified_manifest, resolve_current  # noqa: E402
from ragserve.index.hnsw import HnswIndex  # noqa: E402
from ragserve.index.metadata import FieldColumns  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--field", action="append", default=[], help="name:type (default: the version's fields)")
    args = parser.parse_args()
    folder = resolve_current(args.index)
    manifest = read_verified_manifest(folder)
    schema = dict(f.split(":", 1) for f in args.field) or dict(manifest.fields) or {"absent": "keyword"}
    chunks = ChunkStore(folder / CHUNKS_FILE, manifest.count)
    started = time.perf_counter()
    decoded = FieldColumns(chunks, schema)
    decode_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fields.npz"
        decoded.write(path)
        started = time.perf_counter()
        FieldColumns.read(path, manifest.count, schema)
        read_s = time.perf_counter() - started
        size = path.stat().st_size
    index = HnswIndex.load(args.index)
    started = time.perf_counter()
    index._row_of_each_chunk()
    records_s = time.perf_counter() - started
    started = time.perf_counter()
    index._decoded_rows()
    decoded_rows_s = time.perf_counter() - started
    result = {
        "chunks": manifest.count,
        "chunk-id map from the document records s": round(records_s, 3),
        "chunk-id map from decoding every chunk s": round(decoded_rows_s, 3),
        "fields": schema,
        "decoded from the chunks s": round(decode_s, 3),
        "read from the stored file s": round(read_s, 4),
        "file bytes": size,
        "cpu": cpu_name(),
        "load": load_avg(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
