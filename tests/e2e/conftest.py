"""Everything under tests/e2e starts real server processes (helpers in tests/e2e/servers.py).

The servers modules share for a whole session are fixtures of their folder, so a folder is what
runs in one process: tests/e2e/shared/ (the full server and the retrieval-only one) and
tests/e2e/float32/ (the float32 server). deploy/local/test.sh runs each such folder in a pytest
process of its own; the modules here start their own servers."""
