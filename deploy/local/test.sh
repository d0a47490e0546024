#!/usr/bin/env bash
# Set up (as for the demo) and run the whole test suite, lint and type checks included.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash deploy/local/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
ruff check .
mypy ragserve indexer
# Every test, e2e and slow included (a plain `pytest` deselects them; see pyproject.toml), in four
# plain pytest processes side by side on the host's cores, one per folder of shared servers:
#   shared   tests/e2e/shared: the modules that share the session's full and retrieval-only servers
#   e2e      the rest of tests/e2e (tests/e2e/float32 shares the float32 server; the others start their own)
#   unit     everything outside tests/e2e but the tests marked slow (the quick suite), and the page
#            in Debian's Chromium (tests/browser, marker `browser`; screenshots in test-output/page/)
#   slow     the tests marked slow outside tests/e2e
#   container  tests/container (marker `container`): the CPU image built with podman and the sidecar
#            pod played from the Kubernetes manifest (deploy/container/). Its image is built and the
#            pod played once the four lanes have ended, on an idle host (a build beside them took
#            the host their timing tests measure). Without podman and without root to
#            install it the test skips, except in CI (CI=true), where it fails.
# A test marked `alone` (a tight timing, the host's load) runs while the other lanes wait
# (tests/conftest.py). Each lane's report is printed when all have ended; --durations: the slowest
# tests, to keep CI within its time. Arguments, when given, go to one plain pytest instead.
if [ "$#" -gt 0 ]; then
    exec pytest -v -ra -m "" -n 0 "$@"
fi
TEST_LANE_LOCKS="$(mktemp -d)"
export TEST_LANE_LOCKS
trap 'rm -rf "$TEST_LANE_LOCKS"' EXIT
lane() {
    local name=$1
    shift
    local started=$SECONDS code=0
    # Each lane its own temporary folder: pytest's numbered folders are cleaned by the next run.
    pytest -v -ra -m "" -n 0 --durations=15 -p no:cacheprovider --basetemp="$TEST_LANE_LOCKS/$name" "$@" \
        >"$TEST_LANE_LOCKS/$name.log" 2>&1 || code=$?
    echo "lane $name: exit $code in $((SECONDS - started)) s"
    return $code
}
lane shared tests/e2e/shared &
shared=$!
lane e2e tests/e2e --ignore=tests/e2e/shared &
e2e=$!
lane unit tests --ignore=tests/e2e --ignore=tests/container -m "not slow" &
unit=$!
lane slow tests --ignore=tests/e2e --ignore=tests/container -m slow &
slow=$!
failed=0
for pid in $shared $e2e $unit $slow; do
    wait "$pid" || failed=1
done
# The container lane's image, built once the other lanes have ended: built beside them it took
# the host their timing tests (`alone`) measure (a base made here: no image registry is assumed;
# BASE_IMAGE names another). The lane builds it again if this failed, and says why.
if [ "$(id -u)" = "0" ] || command -v podman >/dev/null 2>&1; then
    base_args=()
    [ -n "${BASE_IMAGE:-}" ] || base_args=(--local-base)
    started=$SECONDS code=0
    bash deploy/container/build.sh "${base_args[@]}" >"$TEST_LANE_LOCKS/image.log" 2>&1 || code=$?
    echo "image for the container lane (after the lanes): exit $code in $((SECONDS - started)) s"
fi
lane container tests/container || failed=1
for name in unit slow e2e shared container; do
    echo "==================== lane $name ===================="
    cat "$TEST_LANE_LOCKS/$name.log"
done
if [ -f "$TEST_LANE_LOCKS/image.log" ]; then
    echo "==================== the container lane's image (the end of its build log) ===================="
    tail -n 40 "$TEST_LANE_LOCKS/image.log"
fi
exit $failed
