"""`ragserve`: serve, prepare models, ask questions and look after the caches from the command line.

Each command module registers on one Typer app (`cli/app.py`): `serve.py` (serve, prepare-models),
`client_commands.py` (ask, retrieve), `health_command.py` (health), `source_command.py` (source),
`admin.py` (cache-flush), `keys.py` (keys add, revoke, list).
"""

# isort: off
# Imported for the commands they register, in the order `--help` lists them.
from ragserve.cli import serve  # noqa: F401
from ragserve.cli import client_commands  # noqa: F401
from ragserve.cli import health_command  # noqa: F401
from ragserve.cli import source_command  # noqa: F401
from ragserve.cli import admin  # noqa: F401
from ragserve.cli import keys  # noqa: F401

# isort: on
from ragserve.cli.app import app

__all__ = ["app", "main"]


def main() -> None:
    # vLLM's engine core is a spawned process: everything that starts it runs under this guard.
    app()
