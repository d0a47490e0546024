"""What a build reads: a folder of documents, one document file, or a BEIR corpus (.jsonl). The
one place that picks the reader, above both (indexer/loaders.py, indexer/beir.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from indexer.beir import iter_beir
from indexer.formats import SUPPORTED_SUFFIXES, LoadLimits
from indexer.loaders import Document, Skipped, SourceError, iter_folder, iter_folder_files


def iter_source(source: Path, limits: LoadLimits | None = None) -> Iterator[Document | Skipped]:
    if not source.exists():
        raise SourceError(f"{source} does not exist")
    if source.is_dir():
        return iter_folder(source, limits)
    if source.name.endswith(".jsonl"):
        return iter_beir(source, limits)
    if source.suffix.lower() in SUPPORTED_SUFFIXES:
        named = source.resolve()  # a file named on the command line is read even through a link
        return iter_folder_files(named.parent, [named], limits)
    raise SourceError(
        f"{source}: unsupported source; give a folder (of {', '.join(sorted(SUPPORTED_SUFFIXES))} files) "
        "or a BEIR corpus .jsonl file"
    )
