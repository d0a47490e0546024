#!/usr/bin/env bash
# The main job on the embedded defaults: set up, index the bundled sample documents, start the
# service on a Unix socket, stream a real answer through the gRPC client, stop the service.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash deploy/local/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate

mkdir -p var
export RAGSERVE_INDEX_PATH=${RAGSERVE_INDEX_PATH:-$PWD/var/index/sample}
export RAGSERVE_UDS_PATH=${RAGSERVE_UDS_PATH:-$PWD/var/ragserve.sock}
QUESTION=${1:-"What does the TCP three-way handshake exchange between client and server?"}

ragserve-index build indexer/sample_docs --out "$RAGSERVE_INDEX_PATH" --log-file var/index.log

ragserve serve > var/server.log 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
echo "starting ragserve (pid $server, log in var/server.log); loading models..."
# SERVING comes first; then warming pre-fills the sample's passages in the KV cache (seconds).
if ! ragserve health --uds "$RAGSERVE_UDS_PATH" --warm --wait 300; then
  tail -n 40 var/server.log
  exit 1
fi

echo
echo "Q: $QUESTION"
ragserve ask "$QUESTION" --uds "$RAGSERVE_UDS_PATH"
echo
echo "Q: How does the honey bee waggle dance encode the direction and distance of food?"
ragserve ask "How does the honey bee waggle dance encode the direction and distance of food?" --uds "$RAGSERVE_UDS_PATH"
echo
# Nothing in the sample covers this: the server declines before the generator, with its evidence.
echo "Q: Who won the 1987 Heisman trophy?"
ragserve ask "Who won the 1987 Heisman trophy?" --uds "$RAGSERVE_UDS_PATH"
