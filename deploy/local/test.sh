#!/usr/bin/env bash
# Set up (as for the demo) and run the whole test suite, lint and type checks included.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash deploy/local/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
ruff check .
mypy ragserve indexer
# Every test, e2e and slow included (a plain `pytest` deselects them; see pyproject.toml), on two
# worker processes (pytest-xdist): each file runs whole on one worker, and the files that share an
# end-to-end server on the same one, first (tests/conftest.py), so no server starts twice; a test
# marked `alone` (a tight timing, the host's load) runs while the other worker waits.
# --durations: the slowest tests, to keep CI within its time.
exec pytest -v -ra -m "" -n 2 --dist loadfile --no-loadscope-reorder --durations=25 "$@"
