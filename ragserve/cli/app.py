"""The `ragserve` command: the Typer app every command module registers on, and its entry point."""

from __future__ import annotations

import typer

from ragserve.config import TransportSettings, default_of

# Where the client commands look for the server unless told otherwise: its own default address.
DEFAULT_HOST: str = default_of(TransportSettings, "host")
DEFAULT_PORT: int = default_of(TransportSettings, "port")

app = typer.Typer(add_completion=False, no_args_is_help=True, help="ragserve: a low-latency RAG sidecar.")


def setup_logging(default_format: str = "json", verbose: bool = False) -> None:
    from ragserve.logs import setup_logging as setup

    setup(default_format, verbose)
