"""`ragserve keys`: named API keys (RAGSERVE_API_KEYS_FILE; the file's format: ragserve/api_keys.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

import typer

from ragserve.cli.app import app

keys = typer.Typer(no_args_is_help=True, help="Named API keys: a key names its caller, as a certificate does.")
app.add_typer(keys, name="keys")

FileOption = Annotated[
    Path | None, typer.Option("--file", help="The key file (default: RAGSERVE_API_KEYS_FILE)", show_default=False)
]


def _key_file(given: Path | None) -> Path:
    if given is not None:
        return given
    from ragserve.config import AccessSettings

    configured = AccessSettings().api_keys_file
    if not configured:
        raise typer.BadParameter("give --file or set RAGSERVE_API_KEYS_FILE", param_hint="--file")
    return Path(configured).expanduser()


@keys.command("add")
def add(
    name: Annotated[str, typer.Argument(help="The caller's name, as grants and caller limits name it")],
    file: FileOption = None,
    expires: Annotated[str | None, typer.Option(help="Last day the key works (YYYY-MM-DD, UTC)")] = None,
) -> None:
    """Make a random key for NAME, print it once (only its hash is kept) and add it to the file."""
    from ragserve.api_keys import add_key, digest_of

    try:
        last_day = dt.date.fromisoformat(expires) if expires else None
        key = add_key(_key_file(file), name, last_day)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    typer.echo(key)
    fingerprint = digest_of(key).hex()[:12]
    typer.echo(f"(the key for {name}, fingerprint {fingerprint}: shown once, only its hash is kept)", err=True)


@keys.command("revoke")
def revoke(
    name: Annotated[str, typer.Argument(help="The caller whose keys stop working")],
    file: FileOption = None,
    fingerprint: Annotated[str, typer.Option(help="Only the key with this fingerprint (`keys list`)")] = "",
) -> None:
    """Remove the keys of NAME (or one of them); a running server stops accepting them within seconds."""
    from ragserve.api_keys import revoke_keys

    removed = revoke_keys(_key_file(file), name, fingerprint)
    if not removed:
        typer.echo(f"no key for {name}", err=True)
        raise typer.Exit(1)
    typer.echo(f"revoked {removed} key(s) of {name}")


@keys.command("list")
def list_keys(file: FileOption = None) -> None:
    """The callers that hold keys: each key's fingerprint and expiry (never a key or its whole hash)."""
    from ragserve.api_keys import read_keys

    for entry in read_keys(_key_file(file)):
        expiry = entry.expires.isoformat() if entry.expires else "no expiry"
        typer.echo(f"{entry.name}\t{entry.fingerprint}\t{expiry}")
