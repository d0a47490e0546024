#!/usr/bin/env bash
# Set up (as for the demo) and run the whole test suite, lint and type checks included.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash deploy/local/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
ruff check .
mypy ragserve indexer
# -m "": every test, e2e and slow included (a plain `pytest` deselects them; see pyproject.toml).
# --durations: the slowest tests, to keep CI within its time.
pytest -v -ra -m "" --durations=25 "$@"
