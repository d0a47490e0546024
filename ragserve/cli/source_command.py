"""`ragserve source`: a citation's quote shown in its document, within the caller's grant."""

from __future__ import annotations

from typing import Annotated

import typer

from ragserve.cli.app import app
from ragserve.cli.client_commands import ClientFlags, client_command, run_client
from ragserve.cli.printing import where_of


@app.command()
@client_command
def source(
    chunk_id: Annotated[str, typer.Argument(help="The cited chunk (a citation's chunk_id)")],
    flags: ClientFlags,
    start: Annotated[int | None, typer.Option(help="The quote's start in the document (quote_start)")] = None,
    end: Annotated[int | None, typer.Option(help="The quote's end in the document (quote_end)")] = None,
    context: Annotated[int | None, typer.Option(help="Characters shown on each side (default 600)")] = None,
) -> None:
    """The document text around a citation's quote, the quote marked >>> like this <<<."""
    from ragserve.client import RagClient

    async def run() -> None:
        async with RagClient(flags.target, access=flags.access()) as client:
            view = await client.source(chunk_id, start, end, context)
        if not view.found:
            print(f"not found: {chunk_id} (no such chunk, or not readable with these credentials)")
            raise typer.Exit(1)
        where = where_of(view.location) if view.HasField("location") else f"{view.doc_id} (no location recorded)"
        print(f"{view.title or view.doc_id} -- {where}, chars {view.quote_start}-{view.quote_end}")
        a, b = view.quote_start - view.text_start, view.quote_end - view.text_start
        print(f"{view.text[:a]}>>> {view.text[a:b]} <<<{view.text[b:]}")

    run_client(run, flags.target)
