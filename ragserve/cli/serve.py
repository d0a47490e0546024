"""`ragserve serve` and `ragserve prepare-models`: running the service and readying its models."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from ragserve.cli.app import DEFAULT_HOST, DEFAULT_PORT, app, setup_logging
from ragserve.config import (
    EmbedderSettings,
    GeneratorSettings,
    Settings,
    default_generator_path,
    default_home,
    merged_generator_path,
)
from ragserve.errors import RagError


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help=f"Listen host (default {DEFAULT_HOST})")] = None,
    port: Annotated[int | None, typer.Option(help=f"Listen port (default {DEFAULT_PORT})")] = None,
    uds: Annotated[str | None, typer.Option(help="Listen on this Unix socket path instead")] = None,
    index: Annotated[Path | None, typer.Option(help="Index root (RAGSERVE_INDEX_PATH)")] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Also log third-party libraries' INFO lines (vLLM's included)")
    ] = False,
) -> None:
    """Run the gRPC service until SIGTERM or SIGINT."""
    setup_logging(verbose=verbose)
    from pydantic import ValidationError

    from ragserve.server.app import serve as serve_async

    try:
        settings = settings_from_flags(host, port, uds, index)
        asyncio.run(serve_async(settings))
    except (RagError, ValidationError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def settings_from_flags(host: str | None, port: int | None, uds: str | None, index: Path | None) -> Settings:
    """`serve`'s flags over the environment: a flag left out keeps its variable (or default)."""
    transport = {key: value for key, value in (("host", host), ("port", port), ("uds_path", uds)) if value is not None}
    return Settings(transport=transport, index={} if index is None else {"path": index})  # type: ignore[arg-type]


@app.command("prepare-models")
def prepare_models(
    target: Annotated[Path | None, typer.Option(help="Where to write the generator folder")] = None,
    force: Annotated[bool, typer.Option(help="Convert again even if already prepared")] = False,
    int8: Annotated[
        bool,
        typer.Option(
            "--int8",
            help="Also export the served generator as W8A8 int8 (llmcompressor, in an environment of its own; "
            "RAGSERVE_GENERATOR_WEIGHTS=int8 serves it)",
        ),
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Also show third-party libraries' INFO lines on the console")
    ] = False,
    log_file: Annotated[Path | None, typer.Option(help="Also write every log line (third-party INFO too) here")] = None,
) -> None:
    """Convert the bundled SmolLM2-135M-Instruct GGUF into an HF folder vLLM loads, merge the
    generator adapter (RAGSERVE_GENERATOR_ADAPTER) into a folder of its own, and export the query
    embedder to ONNX when that backend is configured (each once)."""
    from ragserve.logs import setup_cli_logging

    setup_cli_logging(verbose, log_file)
    from pydantic import ValidationError

    from ragserve.factory import make_embedder
    from ragserve.generate.model_prep import int8_folder, prepare_generator, prepare_int8, prepare_merged

    try:
        embedder_settings, generator = EmbedderSettings(), GeneratorSettings()
        base = generator.base_model_folder()
        if not generator.model:
            base = prepare_generator(target or default_generator_path(), force=force)
        adapter = generator.adapter_folder()
        if adapter is not None:
            # Merged once here, so every engine serves a plain model at full speed.
            merged = merged_generator_path(base, adapter)
            path = prepare_merged(base, adapter, merged, force=force)
            typer.echo(f"generator ready at {path} (adapter {adapter.name}; RAGSERVE_GENERATOR_ADAPTER=none: {base})")
        else:
            path = base
            typer.echo(f"generator ready at {base}")
        if int8:
            environment = default_home() / "quantize-venv"
            exported = prepare_int8(path, int8_folder(path), environment, force=force)
            typer.echo(f"int8 generator ready at {exported} (served with RAGSERVE_GENERATOR_WEIGHTS=int8)")
        if embedder_settings.backend == "onnx" and embedder_settings.device == "cpu":
            # The server would otherwise pay for the ONNX export on its first start.
            embedder = make_embedder(embedder_settings)
            typer.echo(f"ONNX query embedder ready: {embedder.model_id}")
    except (RagError, ValidationError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
