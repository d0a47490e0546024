"""`ragserve-index`: build a verified, versioned index from documents."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated

import typer

from indexer.build import build_index
from indexer.chunking import ChunkingConfig
from indexer.loaders import Skipped, SourceError
from ragserve.config import DEFAULT_EMBEDDER, Settings
from ragserve.errors import RagError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Build ragserve indexes.")


@app.callback()
def _root() -> None:
    """Build ragserve indexes."""


@app.command()
def build(
    source: Annotated[Path, typer.Argument(help="A folder of .txt/.md files, or a BEIR corpus.jsonl")],
    out: Annotated[Path | None, typer.Option(help="Index root (default: RAGSERVE_INDEX_PATH)")] = None,
    embedder: Annotated[str, typer.Option(help="Embedder HF id or local path")] = DEFAULT_EMBEDDER,
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    chunk_tokens: Annotated[int, typer.Option(help="Chunk size in tokenizer tokens")] = 200,
    overlap_tokens: Annotated[int, typer.Option(help="Overlap between chunks in tokens")] = 40,
    batch_size: Annotated[int, typer.Option(min=1, help="Embedding batch size")] = 64,
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
) -> None:
    """Index SOURCE and publish a new version atomically."""
    from ragserve.embedding import SentenceTransformerEmbedder

    target = out or Settings().index_path
    try:
        chunking = ChunkingConfig(chunk_tokens, overlap_tokens)
        model = SentenceTransformerEmbedder(embedder, device=device)

        def warn(item: Skipped) -> None:
            typer.echo(f"skipped {item.source}: {item.reason}", err=True)

        report = build_index(source, target, model, chunking, batch_size, progress, on_skip=warn)
    except (SourceError, RagError, ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(
        f"published version {report.version} at {report.folder}: {report.documents} documents, "
        f"{report.chunks} chunks, {len(report.skipped)} skipped, {report.seconds:.1f} s "
        f"({report.docs_per_second:.1f} documents/s)"
    )


def main() -> None:
    logging.basicConfig(level=os.environ.get("RAGSERVE_LOG_LEVEL", "WARNING"))
    app()
