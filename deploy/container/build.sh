#!/usr/bin/env bash
# Builds the CPU image (deploy/docker/Dockerfile.cpu, target ragserve) with podman, from this
# repository, with pip's package sources as deploy/local/setup.sh uses them.
#
#   bash deploy/container/build.sh                # on python:3.11-slim-bookworm (pulled from its registry)
#   bash deploy/container/build.sh --local-base   # where no image registry answers: a Debian bookworm
#                                                  # base made here with mmdebstrap (Debian's mirror only)
#   bash deploy/container/build.sh --no-cache     # every layer built again (the base is kept)
#
# Environment:
#   IMAGE            the image's name (default ragserve:cpu); also tagged as the name the Kubernetes
#                    manifests pull, ghcr.io/example/ragserve:cpu-0.1.0, so that they run it as written
#   BASE_IMAGE       the base image (default python:3.11-slim-bookworm; with --local-base the one made here)
#   TORCH_INDEX_URL  where pip finds torch's CPU build (as for setup.sh); unset: pip's own sources when
#                    they carry it, else PyTorch's CPU index
#   DEBIAN_MIRROR    the mirror mmdebstrap installs the local base from (default deb.debian.org)
#
# As root it installs what it needs from Debian's packages (podman, runc, mmdebstrap) when missing.
# Where podman cannot start containers as installed (no systemd, a hybrid cgroup layout, no
# permission to raise the open-file limit) deploy/container/containers.conf is used unless
# CONTAINERS_CONF names another. A second run reuses the base and every layer that did not change.
set -euo pipefail
cd "$(dirname "$0")/../.."

local_base=0
cache_args=()
for arg in "$@"; do
  case "$arg" in
    --local-base) local_base=1 ;;
    --no-cache) cache_args=(--no-cache) ;;
    *)
      echo "usage: $0 [--local-base] [--no-cache]" >&2
      exit 2
      ;;
  esac
done

IMAGE=${IMAGE:-ragserve:cpu}
MANIFEST_IMAGE=ghcr.io/example/ragserve:cpu-0.1.0
LOCAL_BASE=localhost/ragserve-base:bookworm
TORCH_VERSION=2.13.0
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/deploy/container/containers.conf}

need=()
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v runc >/dev/null 2>&1 || need+=(runc)
# A pod's infra container runs podman's pause image, built locally around catatonit: podman only
# recommends it, so a podman installed without recommends cannot play a pod.
command -v catatonit >/dev/null 2>&1 || need+=(catatonit)
if [ "$local_base" = 1 ] && ! command -v mmdebstrap >/dev/null 2>&1; then
  need+=(mmdebstrap)
fi
if [ "${#need[@]}" -gt 0 ]; then
  if [ "$(id -u)" != "0" ]; then
    echo "build: missing ${need[*]}; install with: sudo apt-get install -y ${need[*]}" >&2
    exit 1
  fi
  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}"
fi

# Debian bookworm's Python 3.11 (venv, headers) with this host's certificate authorities: pip in the
# build must trust what pip here trusts (a proxy's own authority included).
make_local_base() {
  local work
  work=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" RETURN
  echo "build: making $LOCAL_BASE with mmdebstrap"
  mmdebstrap --variant=minbase --include=python3,python3-venv,python3-dev,ca-certificates \
    --customize-hook='upload /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt' \
    bookworm "$work/rootfs.tar" ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"}
  podman import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' \
    "$work/rootfs.tar" "$LOCAL_BASE" >/dev/null
}

if [ "$local_base" = 1 ]; then
  if ! podman image exists "$LOCAL_BASE"; then
    make_local_base
  fi
  BASE_IMAGE=${BASE_IMAGE:-$LOCAL_BASE}
fi
BASE_IMAGE=${BASE_IMAGE:-python:3.11-slim-bookworm}

# pip's sources here, as build arguments and read-only mounts (deploy/container/pip_sources.py),
# read by the venv's python when there is one (setup.sh's), else by python3.
python=python3
[ -x .venv/bin/python ] && python=.venv/bin/python
sources=()
if "$python" -m pip --version >/dev/null 2>&1; then
  mapfile -t sources < <("$python" deploy/container/pip_sources.py "$TORCH_VERSION")
fi

started=$SECONDS
podman build \
  "${cache_args[@]}" \
  --file deploy/docker/Dockerfile.cpu \
  --target ragserve \
  --build-arg "BASE_IMAGE=$BASE_IMAGE" \
  "${sources[@]}" \
  --tag "$IMAGE" \
  --tag "$MANIFEST_IMAGE" \
  .
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
echo "build: $IMAGE (also $MANIFEST_IMAGE) on $BASE_IMAGE in $((SECONDS - started)) s, $((size / 1000000)) MB"
