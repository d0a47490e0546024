"""`ragserve-index`: build a verified, versioned index from documents."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from indexer.build import IndexingEmbedder, IndexRootLocked, build_index, index_root_lock
from indexer.chunking import ChunkingConfig
from indexer.loaders import (
    DEFAULT_MAX_FILE_MB,
    DEFAULT_MAX_TEXT_CHARS,
    DEFAULT_PARSE_TIMEOUT_S,
    LoadLimits,
    Skipped,
    SourceError,
)
from ragserve.config import EmbedderSettings, IndexSettings, QdrantSettings, default_of
from ragserve.errors import RagError
from ragserve.logs import setup_cli_logging

# Each Qdrant call while publishing (uploads are larger than the server's searches, which use
# RAGSERVE_QDRANT_TIMEOUT_S).
PUBLISH_TIMEOUT_S = 10

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Build ragserve indexes.")


@app.callback()
def _root() -> None:
    """Build ragserve indexes."""


@app.command()
def build(
    source: Annotated[Path, typer.Argument(help="A folder of .txt/.md/.html/.pdf files, or a BEIR corpus.jsonl")],
    out: Annotated[Path | None, typer.Option(help="Index root (default: RAGSERVE_INDEX_PATH)")] = None,
    # The server's defaults (EmbedderSettings), but torch: the indexer's documented backend.
    embedder: Annotated[str, typer.Option(help="Embedder HF id or local path")] = default_of(EmbedderSettings, "model"),
    device: Annotated[str, typer.Option(help="cpu or cuda (torch backend)")] = default_of(EmbedderSettings, "device"),
    backend: Annotated[str, typer.Option(help="Embedding backend: torch or onnx")] = "torch",
    int8: Annotated[bool, typer.Option(help="ONNX backend: int8 dynamic quantization")] = default_of(
        EmbedderSettings, "onnx_int8"
    ),
    full: Annotated[bool, typer.Option(help="Re-embed every document (ignore the published version)")] = False,
    qdrant_url: Annotated[
        str, typer.Option(help="Also publish to Qdrant: http(s)://host:6333, or a local folder (local mode)")
    ] = "",
    qdrant_collection: Annotated[str, typer.Option(help="Qdrant alias to publish under")] = default_of(
        QdrantSettings, "collection"
    ),
    qdrant_api_key: Annotated[str, typer.Option(envvar="RAGSERVE_QDRANT_API_KEY", help="Qdrant API key")] = "",
    chunk_tokens: Annotated[int, typer.Option(help="Chunk size in tokenizer tokens")] = 200,
    overlap_tokens: Annotated[int, typer.Option(help="Overlap between chunks in tokens")] = 40,
    # 16 measured faster than 64 for both backends on full SciFact (BENCHMARKS.md).
    batch_size: Annotated[int, typer.Option(min=1, help="Embedding batch size")] = 16,
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
    max_file_mb: Annotated[
        float,
        typer.Option(min=0.0, envvar="RAGSERVE_INDEXER_MAX_FILE_MB", help="Skip files larger than this (raw MB)"),
    ] = DEFAULT_MAX_FILE_MB,
    max_text_chars: Annotated[
        int,
        typer.Option(min=1, envvar="RAGSERVE_INDEXER_MAX_TEXT_CHARS", help="Skip files whose extracted text is longer"),
    ] = DEFAULT_MAX_TEXT_CHARS,
    parse_timeout_s: Annotated[
        float,
        typer.Option(
            min=0.001, envvar="RAGSERVE_INDEXER_PARSE_TIMEOUT_S", help="Skip HTML/PDF files that take longer to parse"
        ),
    ] = DEFAULT_PARSE_TIMEOUT_S,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Also show third-party libraries' INFO lines on the console")
    ] = False,
    log_file: Annotated[
        Path | None,
        typer.Option(envvar="RAGSERVE_INDEXER_LOG_FILE", help="Also write every log line (third-party INFO too) here"),
    ] = None,
) -> None:
    """Index SOURCE and publish a new version atomically (incremental over the published one)."""
    setup_cli_logging(verbose, log_file, own_default="WARNING")
    target = out or IndexSettings().path
    if backend not in ("torch", "onnx"):
        typer.echo(f"error: --backend must be torch or onnx, got {backend!r}", err=True)
        raise typer.Exit(2)
    limits = LoadLimits(int(max_file_mb * 1024 * 1024), max_text_chars, parse_timeout_s)
    qdrant_line = ""
    try:
        chunking = ChunkingConfig(chunk_tokens, overlap_tokens)
        # Check the source before loading a model: a typo fails in milliseconds, not seconds.
        if not source.exists():
            raise SourceError(f"{source} does not exist")
        # Also before the model: a second indexer on the same root stops at once. Held through the
        # Qdrant publish too, which reads the version this build published.
        with index_root_lock(target):
            if not progress:
                from transformers.utils import logging as hf_logging

                hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # --no-progress: quiet load too
            model = load_embedder(embedder, backend, device, int8)

            def warn(item: Skipped) -> None:
                if not item.ignored:
                    typer.echo(f"skipped {item.source}: {item.reason}", err=True)

            report = build_index(
                source,
                target,
                model,
                chunking,
                batch_size,
                progress,
                on_skip=warn,
                incremental=not full,
                embedder_backend="onnx-int8" if backend == "onnx" and int8 else backend,
                limits=limits,
            )
            if qdrant_url:
                qdrant_line = _publish_to_qdrant(qdrant_url, qdrant_collection, qdrant_api_key, target)
    except (SourceError, RagError, ValueError, OSError, IndexRootLocked) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if qdrant_line:
        typer.echo(qdrant_line)
    what = f"published version {report.version}" if report.published else f"unchanged: version {report.version}"
    typer.echo(
        f"{what} at {report.folder}: {report.documents} documents ({report.embedded} embedded, "
        f"{report.reused} unchanged, {report.removed} removed), {report.chunks} chunks, "
        f"{sum(not s.ignored for s in report.skipped)} skipped, "
        f"{sum(s.ignored for s in report.skipped)} ignored (unsupported type), "
        f"{report.seconds:.1f} s ({report.docs_per_second:.1f} documents/s)"
    )


def _publish_to_qdrant(url: str, name: str, api_key: str, root: Path) -> str:
    try:
        collection, version = _to_qdrant(url, name, api_key, root)
    except Exception as exc:  # connection, auth and server errors come from several libraries
        typer.echo(f"error: publishing to Qdrant at {url} failed: {exc}", err=True)
        raise typer.Exit(2) from None
    return f"published to Qdrant: alias {name!r} -> {collection} (version {version})"


def _to_qdrant(url: str, name: str, api_key: str, root: Path) -> tuple[str, int]:
    from indexer.qdrant_publish import publish_folder_to_qdrant
    from ragserve.index.qdrant_index import make_client

    client = make_client(url, api_key or None, PUBLISH_TIMEOUT_S)
    try:
        return publish_folder_to_qdrant(client, name, root)
    finally:
        client.close()


def load_embedder(model: str, backend: str, device: str, int8: bool) -> IndexingEmbedder:
    """Through the server's factory. ONNX always runs on the CPU here, with ONNX Runtime's own
    thread count (every core): a batch job, not one query at a time."""
    from ragserve.factory import make_embedder

    cfg = EmbedderSettings(
        model=model,
        backend=backend,  # type: ignore[arg-type]  # checked by the caller and by the settings
        device="cpu" if backend == "onnx" else device,  # type: ignore[arg-type]
        onnx_int8=int8,
        threads=0,
    )
    return make_embedder(cfg, indexing=True)


def main() -> None:
    # Quiet from the start; a command sets its own flags (--verbose, --log-file) before it loads models.
    setup_cli_logging(own_default="WARNING")
    app()
