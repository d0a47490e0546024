#!/usr/bin/env bash
# The sidecar pod of deploy/k8s/ragserve-sidecar.yaml under podman (`podman kube play`), on the image
# deploy/container/build.sh builds. What is changed for podman 4.3, and why: deploy/container/podman_kube.py.
#
#   bash deploy/container/pod.sh demo [--local-base]   all of the below: build, up, ask, down
#   bash deploy/container/pod.sh up [--local-base]     build the image (layers reused), build the first
#                                                      index with the manifest's job, play the app pod,
#                                                      wait until the sidecar's health is SERVING
#   bash deploy/container/pod.sh ask [QUESTION]        `ragserve ask` in the app container, over the socket
#   bash deploy/container/pod.sh down                  stop the pod (SIGTERM: the sidecar drains), print
#                                                      the sidecar's exit code, remove the pod and its volumes
#
# --local-base: where no image registry answers (build.sh). Environment: as build.sh's; the
# sidecar's exit code is also the exit code of `down` (0 after a clean drain).
set -euo pipefail
cd "$(dirname "$0")/../.."

export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/deploy/container/containers.conf}
MANIFEST=deploy/k8s/ragserve-sidecar.yaml
IMAGE=ghcr.io/example/ragserve:cpu-0.1.0 # the name the manifest pulls; build.sh tags it
POD=app-with-ragserve-pod-0              # podman names a Deployment's pod <name>-pod-0
SIDECAR=$POD-ragserve
APP=$POD-app
INDEX_POD=ragserve-index-first
SOCKET=/run/ragserve/ragserve.sock
STOP_TIMEOUT_S=${STOP_TIMEOUT_S:-30} # the pod's terminationGracePeriodSeconds (Kubernetes' default)

# The manifests podman plays, written by podman_kube.py run inside the image.
render() {
  local out=$1
  podman run --rm --network none --user "$(id -u):$(id -g)" --entrypoint python3 \
    -v "$PWD/deploy:/deploy:ro" -v "$out:/out" "$IMAGE" \
    /deploy/container/podman_kube.py "/deploy/${MANIFEST#deploy/}" /out "$IMAGE"
}

up() {
  bash deploy/container/build.sh "$@"
  local work started code
  work=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" RETURN
  render "$work"
  down_quietly
  # The first version of the index: the CronJob's pod, once (its volume is the claim's).
  started=$SECONDS
  podman kube play "$work/index.yaml" >/dev/null
  code=$(podman wait "$INDEX_POD-index")
  if [ "$code" != "0" ]; then
    podman logs "$INDEX_POD-index" >&2 || true
    echo "pod: the index job exited $code" >&2
    exit 1
  fi
  podman pod rm --force "$INDEX_POD" >/dev/null
  echo "pod: index built in $((SECONDS - started)) s"
  started=$SECONDS
  podman kube play "$work/app.yaml" >/dev/null
  # podman 4.3 plays no readiness probe: the startup probe's own command, until SERVING.
  if ! podman exec "$SIDECAR" ragserve health --uds "$SOCKET" --wait 300; then
    podman logs --tail 50 "$SIDECAR" >&2 || true
    echo "pod: the sidecar did not become SERVING" >&2
    exit 1
  fi
  echo "pod: $POD SERVING $((SECONDS - started)) s after kube play"
}

ask() {
  local question=${1:-How does the honey bee waggle dance encode the direction and distance of food?}
  podman exec "$APP" ragserve ask --uds "$SOCKET" "$question"
}

down() {
  podman pod stop --time "$STOP_TIMEOUT_S" "$POD" >/dev/null
  local code
  code=$(podman inspect --format '{{.State.ExitCode}}' "$SIDECAR")
  echo "pod: the sidecar exited $code"
  podman pod rm --force "$POD" >/dev/null
  podman volume rm --force ragserve-index >/dev/null
  return "$code"
}

# What an earlier run left: the pods and the index volume (the emptyDirs go with their pod).
down_quietly() {
  podman pod rm --force "$POD" "$INDEX_POD" >/dev/null 2>&1 || true
  podman volume rm --force ragserve-index >/dev/null 2>&1 || true
}

command=${1:-}
shift || true
case "$command" in
  up) up "$@" ;;
  ask) ask "$@" ;;
  down) down ;;
  demo)
    up "$@"
    ask
    down
    ;;
  *)
    echo "usage: $0 demo|up [--local-base] | ask [QUESTION] | down" >&2
    exit 2
    ;;
esac
