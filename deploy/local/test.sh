#!/usr/bin/env bash
# Set up (as for the demo) and run the whole test suite, lint and type checks included.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash deploy/local/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
ruff check .
mypy ragserve indexer
# Every test, e2e and slow included (a plain `pytest` deselects them; see pyproject.toml), in two
# calls. First all but the `serial` tests, on two worker processes (pytest-xdist): each file runs
# whole on one worker, and the files that share an end-to-end server on the same one, first
# (tests/conftest.py), so no server starts twice. Then the `serial` tests, which measure the host's
# load or a tight timing, alone in one process. --durations: the slowest tests, to keep CI within
# its time.
status=0
pytest -v -ra -m "not serial" -n 2 --dist loadfile --no-loadscope-reorder --durations=25 "$@" || status=$?
serial=0
pytest -v -ra -m "serial" --durations=10 "$@" || serial=$?
# 5: no test selected (arguments that name no serial test).
if [ "$serial" -ne 0 ] && [ "$serial" -ne 5 ]; then
  status=$serial
fi
exit "$status"
