"""`ragserve-index`: build a verified, versioned index from documents."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from indexer import host_share
from indexer.build import BuildReport, build_index
from indexer.chunking import ChunkingConfig
from indexer.embedding import BEST_BATCH, IndexingEmbedder, LazyEmbedder, load_embedder
from indexer.formats import (
    DEFAULT_MAX_FILE_MB,
    DEFAULT_MAX_TEXT_CHARS,
    DEFAULT_PARSE_MEMORY_MB,
    DEFAULT_PARSE_TIMEOUT_S,
    LoadLimits,
)
from indexer.loaders import Skipped, SourceError
from indexer.metadata import parse_declared
from indexer.root_lock import IndexRootLocked, index_root_lock
from indexer.tune.commands import register as register_tune_commands
from ragserve.config import EmbedderSettings, IndexSettings, QdrantSettings, default_of
from ragserve.embed.base import reported_model_id
from ragserve.errors import RagError
from ragserve.logs import setup_cli_logging

# Each Qdrant call while publishing (uploads are larger than the server's searches, which use
# RAGSERVE_QDRANT_TIMEOUT_S).
PUBLISH_TIMEOUT_S = 10

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Build ragserve indexes.")


@app.callback()
def _root(
    nice: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=19,
            envvar="RAGSERVE_INDEXER_NICE",
            help="Lower CPU priority by this much (default: 10, which costs nothing on an idle host)",
            show_default=False,
        ),
    ] = None,
    threads: Annotated[
        int,
        typer.Option(
            min=0,
            envvar="RAGSERVE_INDEXER_THREADS",
            help="Compute threads (0: measured; every usable CPU on an idle host, fewer beside other work)",
        ),
    ] = 0,
) -> None:
    """Build ragserve indexes. Uses the host as it finds it, at a lower priority: every CPU when
    nothing else keeps them busy, fewer threads beside a server or other work, re-read while a
    build runs (--threads and --nice pin either)."""
    host_share.share_host(nice, threads)


# The longer option declarations of `build`, named so its signature reads as a list of flags.
_QdrantUrlOption = Annotated[
    str, typer.Option(help="Also publish to Qdrant: http(s)://host:6333, or a local folder (local mode)")
]
_MaxFileMbOption = Annotated[
    float,
    typer.Option(min=0.0, envvar="RAGSERVE_INDEXER_MAX_FILE_MB", help="Skip files larger than this (raw MB)"),
]
_MaxTextCharsOption = Annotated[
    int,
    typer.Option(min=1, envvar="RAGSERVE_INDEXER_MAX_TEXT_CHARS", help="Skip files whose extracted text is longer"),
]
_ParseTimeoutOption = Annotated[
    float,
    typer.Option(
        min=0.001, envvar="RAGSERVE_INDEXER_PARSE_TIMEOUT_S", help="Skip HTML/PDF files that take longer to parse"
    ),
]
_ParseMemoryOption = Annotated[
    int,
    typer.Option(
        min=128,
        envvar="RAGSERVE_INDEXER_PARSE_MEMORY_MB",
        help="Skip HTML/PDF files whose parsing needs more memory (the parse worker's address space)",
    ),
]
_VerboseOption = Annotated[
    bool, typer.Option("--verbose", "-v", help="Also show third-party libraries' INFO lines on the console")
]
_LogFileOption = Annotated[
    Path | None,
    typer.Option(envvar="RAGSERVE_INDEXER_LOG_FILE", help="Also write every log line (third-party INFO too) here"),
]


@app.command()
def build(
    source: Annotated[Path, typer.Argument(help="A folder of .txt/.md/.html/.pdf files, or a BEIR corpus.jsonl")],
    out: Annotated[Path | None, typer.Option(help="Index root (default: RAGSERVE_INDEX_PATH)")] = None,
    # The server's defaults (EmbedderSettings): documents embedded as questions are.
    embedder: Annotated[str, typer.Option(help="Embedder HF id or local path")] = default_of(EmbedderSettings, "model"),
    device: Annotated[str, typer.Option(help="cpu or cuda (torch backend)")] = default_of(EmbedderSettings, "device"),
    backend: Annotated[
        str, typer.Option(help="Embedding backend: onnx or torch (default: the server's, onnx; torch on cuda)")
    ] = "",
    int8: Annotated[bool, typer.Option(help="ONNX backend: int8 dynamic quantization")] = default_of(
        EmbedderSettings, "onnx_int8"
    ),
    full: Annotated[bool, typer.Option(help="Re-embed every document (ignore the published version)")] = False,
    qdrant_url: _QdrantUrlOption = "",
    qdrant_collection: Annotated[str, typer.Option(help="Qdrant alias to publish under")] = default_of(
        QdrantSettings, "collection"
    ),
    qdrant_api_key: Annotated[str, typer.Option(envvar="RAGSERVE_QDRANT_API_KEY", help="Qdrant API key")] = "",
    chunk_tokens: Annotated[int, typer.Option(help="Chunk size in tokenizer tokens")] = 200,
    overlap_tokens: Annotated[int, typer.Option(help="Overlap between chunks in tokens")] = 40,
    batch_size: Annotated[int, typer.Option(min=0, help="Embedding batch size (0: the backend's measured best)")] = 0,
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = True,
    max_file_mb: _MaxFileMbOption = DEFAULT_MAX_FILE_MB,
    max_text_chars: _MaxTextCharsOption = DEFAULT_MAX_TEXT_CHARS,
    parse_timeout_s: _ParseTimeoutOption = DEFAULT_PARSE_TIMEOUT_S,
    parse_memory_mb: _ParseMemoryOption = DEFAULT_PARSE_MEMORY_MB,
    encoding: Annotated[str, typer.Option(help="Encoding of plain-text and Markdown files")] = "utf-8",
    field: Annotated[
        list[str] | None,
        typer.Option(
            "--field",
            help="A filterable metadata field and its type, name:keyword|integer|float|bool|datetime "
            "(repeatable; undeclared fields whose values share one type are filterable too)",
        ),
    ] = None,
    verbose: _VerboseOption = False,
    log_file: _LogFileOption = None,
) -> None:
    """Index SOURCE and publish a new version atomically (incremental over the published one)."""
    setup_cli_logging(verbose, log_file, own_default="WARNING")
    backend = backend or ("torch" if device == "cuda" else default_of(EmbedderSettings, "backend"))
    _check_build_flags(backend, encoding)
    job = _BuildJob(
        source=source,
        target=out or IndexSettings().path,
        embedder=embedder,
        backend=backend,
        device=device,
        int8=int8,
        incremental=not full,
        chunk_tokens=chunk_tokens,
        overlap_tokens=overlap_tokens,
        batch_size=batch_size or BEST_BATCH[backend],
        progress=progress,
        limits=LoadLimits(int(max_file_mb * 1024 * 1024), max_text_chars, parse_timeout_s, encoding, parse_memory_mb),
        fields=tuple(field or ()),
    )
    _build_and_say(job, _QdrantTarget(qdrant_url, qdrant_collection, qdrant_api_key))


def _build_and_say(job: _BuildJob, qdrant: _QdrantTarget) -> None:
    """Run the build (and the Qdrant publish) and print what it did; bad input exits 2 with one line."""
    try:
        report, qdrant_line = _run_build(job, qdrant)
    except (SourceError, RagError, ValueError, OSError, IndexRootLocked) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if qdrant_line:
        typer.echo(qdrant_line)
    typer.echo(_summary(report))


def _check_build_flags(backend: str, encoding: str) -> None:
    """`build`'s flags that typer cannot check alone; a bad one exits 2 with one line."""
    if backend not in ("torch", "onnx"):
        typer.echo(f"error: --backend must be torch or onnx, got {backend!r}", err=True)
        raise typer.Exit(2)
    try:
        "".encode(encoding)
    except LookupError:
        typer.echo(f"error: --encoding {encoding!r} is not an encoding Python knows", err=True)
        raise typer.Exit(2) from None


@dataclass(frozen=True)
class _BuildJob:
    """What `build` was asked to do, checked flags in one place."""

    source: Path
    target: Path
    embedder: str
    backend: str
    device: str
    int8: bool
    incremental: bool
    chunk_tokens: int
    overlap_tokens: int
    batch_size: int
    progress: bool
    limits: LoadLimits
    fields: tuple[str, ...] = ()  # --field name:type

    @property
    def embedder_backend(self) -> str:
        return "onnx-int8" if self.backend == "onnx" and self.int8 else self.backend


@dataclass(frozen=True)
class _QdrantTarget:
    url: str  # empty: no Qdrant publish
    collection: str
    api_key: str


def _run_build(job: _BuildJob, qdrant: _QdrantTarget) -> tuple[BuildReport, str]:
    """Build (and publish to Qdrant when asked); returns the report and the Qdrant line, if any."""
    chunking = ChunkingConfig(job.chunk_tokens, job.overlap_tokens)
    # Check the source before loading a model: a typo fails in milliseconds, not seconds.
    if not job.source.exists():
        raise SourceError(f"{job.source} does not exist")
    # Also before the model: a second indexer on the same root stops at once. Held through the
    # Qdrant publish too, which reads the version this build published.
    with index_root_lock(job.target):
        # Loaded once there is something to embed: no documents, or none changed, costs no model.
        model = LazyEmbedder(reported_model_id(job.embedder), lambda: _quiet_embedder(job))
        _warn_if_the_embedder_changes(job.target, model.model_id)
        with host_share.watching():  # others' load re-read while it runs: threads follow
            report = _build(job, model, chunking)
        qdrant_line = ""
        if qdrant.url:
            qdrant_line = _publish_to_qdrant(qdrant.url, qdrant.collection, qdrant.api_key, job.target)
    return report, qdrant_line


def _build(job: _BuildJob, model: IndexingEmbedder, chunking: ChunkingConfig) -> BuildReport:
    return build_index(
        job.source,
        job.target,
        model,
        chunking,
        job.batch_size,
        job.progress,
        on_skip=_warn_skipped,
        incremental=job.incremental,
        embedder_backend=job.embedder_backend,
        limits=job.limits,
        declared_fields=parse_declared(list(job.fields)),
    )


def _quiet_embedder(job: _BuildJob) -> IndexingEmbedder:
    from huggingface_hub.utils.tqdm import disable_progress_bars

    # One bar: the embedding's. transformers follows the hub's switch when it loads, and importing
    # it here only to say so cost every build 0.7 s.
    disable_progress_bars()
    return load_embedder(job.embedder, job.backend, job.device, job.int8)


def _warn_if_the_embedder_changes(root: Path, model_id: str) -> None:
    """Servers check a version's embedder against their own: say so before they refuse it."""
    from ragserve.index.format import MANIFEST, read_manifest_bytes, resolve_current

    try:
        published = json.loads(read_manifest_bytes(resolve_current(root)))
    except (RagError, OSError, ValueError):
        return  # nothing published yet (or unreadable: the build says why)
    before = str((published.get("tuned_embedder") or {}).get("base") or published.get("embedder_id", ""))
    if before and before != model_id:
        typer.echo(
            f"warning: the published version was built with embedder {before!r}, this one with {model_id!r}: "
            f"servers set to RAGSERVE_EMBEDDER_MODEL={before} will refuse it until set to {model_id} "
            f"({MANIFEST} of the new version names it)",
            err=True,
        )


def _warn_skipped(item: Skipped) -> None:
    if not item.ignored:
        typer.echo(f"skipped {item.source}: {item.reason}", err=True)


def _summary(report: BuildReport) -> str:
    what = f"published version {report.version}" if report.published else f"unchanged: version {report.version}"
    left_out = "".join(
        f"\nmetadata field {name!r} is not filterable: {why}" for name, why in report.fields_left_out.items()
    )
    return (
        f"{what} at {report.folder}: {report.documents} documents ({report.embedded} embedded, "
        f"{report.resumed} resumed from an interrupted build, {report.reused} unchanged, "
        f"{report.relabeled} with new metadata, {report.removed} removed), "
        f"{report.chunks} chunks, "
        f"{sum(not s.ignored for s in report.skipped)} skipped, "
        f"{sum(s.ignored for s in report.skipped)} ignored{_ignored_names(report.skipped)}, "
        f"{report.seconds:.1f} s ({report.docs_per_second:.1f} documents/s"
        + (f"; embedding {report.chunks_per_second:.1f} chunks/s)" if report.chunks_embedded else ")")
        + _where_the_time_went(report)
    ) + left_out


_STAGES = {"read": "reading", "chunk": "chunking", "embed": "embedding", "graph": "graph", "bm25": "BM25"}


def _where_the_time_went(report: BuildReport) -> str:
    """Seconds per stage; embedding runs beside reading and chunking, so they add up past the total."""
    spent = report.stage_seconds
    if not spent:
        return ""
    parts = [f"{name} {spent[key]:.1f} s" for key, name in {**_STAGES, "checks": "checks"}.items() if key in spent]
    return "; time: " + ", ".join(parts) + (" (embedding beside reading and chunking)" if spent.get("embed") else "")


def _ignored_names(skipped: list[Skipped], shown: int = 5) -> str:
    """The files left out on purpose (type, links), named: a person looks for their missing file."""
    names = [f"{s.source} ({s.reason})" for s in skipped if s.ignored]
    if not names:
        return ""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ": " + "; ".join(names[:shown]) + more


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


register_tune_commands(app)  # `tune`, `tune-reranker` (indexer/tune/commands.py), listed after `build`


def main() -> None:
    # Quiet from the start; a command sets its own flags (--verbose, --log-file) before it loads models.
    setup_cli_logging(own_default="WARNING")
    app()
