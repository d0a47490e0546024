"""The `--filter` flag of the client commands: a metadata filter as JSON (docs/filters.md)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

FilterOption = Annotated[
    str | None,
    typer.Option(
        "--filter",
        help='Only documents whose metadata passes this filter (JSON, e.g. \'{"must": [{"key": "lang", '
        '"match": {"value": "en"}}]}\'; docs/filters.md)',
    ),
]


def filter_or_exit(text: str | None) -> Any:
    """The Filter message for `text`; a malformed one exits 2 naming what is wrong."""
    from ragserve.client import filter_message

    try:
        return filter_message(text)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
