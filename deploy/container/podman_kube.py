"""Writes what `podman kube play` (podman 4.3) runs of deploy/k8s/ragserve-sidecar.yaml, with the
fewest changes podman needs; deploy/container/pod.sh runs it inside the image (PyYAML is there).

  index.yaml  the PersistentVolumeClaim (a podman volume of that name) and the CronJob's pod template
              as a Pod (`ragserve-index-first`, restartPolicy Never): the first version of the index,
              built by the manifest's own job spec, as `kubectl create job --from=cronjob/...` would
  app.yaml    the app Deployment, where:
              - the native sidecar (an init container with restartPolicy Always, Kubernetes >= 1.29)
                becomes the first of the pod's containers: podman 4.3 runs init containers to their
                end before the others and cannot start this one at all;
              - the app container, a placeholder image, runs the ragserve image idle under tini
                (`ragserve ask` and the Python client are in it), with the app's own env, mounts and
                resources;
              - every image is taken from local storage (imagePullPolicy Never): nothing is pulled.

Everything else (the security contexts, the env, the volumes, resources, probes) is played as
written; what podman 4.3 does not honour of it is listed in docs/limitations.md.

Usage: python podman_kube.py MANIFEST OUT_FOLDER IMAGE
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml

INDEX_POD = "ragserve-index-first"


def _pod_template(document: dict[str, Any]) -> dict[str, Any]:
    return dict(document["spec"]["jobTemplate"]["spec"]["template"]["spec"])


def index_documents(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    claims = [d for d in documents if d["kind"] == "PersistentVolumeClaim"]
    [cronjob] = [d for d in documents if d["kind"] == "CronJob"]
    spec = copy.deepcopy(_pod_template(cronjob))
    spec["restartPolicy"] = "Never"
    for container in spec["containers"]:
        container["imagePullPolicy"] = "Never"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": INDEX_POD}, "spec": spec}
    return [*claims, pod]


def app_documents(documents: list[dict[str, Any]], image: str) -> list[dict[str, Any]]:
    [deployment] = [copy.deepcopy(d) for d in documents if d["kind"] == "Deployment"]
    spec = deployment["spec"]["template"]["spec"]
    sidecars = [c for c in spec.get("initContainers", []) if c.get("restartPolicy") == "Always"]
    spec["initContainers"] = [c for c in spec.get("initContainers", []) if c not in sidecars]
    if not spec["initContainers"]:
        del spec["initContainers"]
    for sidecar in sidecars:
        del sidecar["restartPolicy"]
    spec["containers"] = sidecars + spec["containers"]
    for container in spec["containers"][len(sidecars) :]:
        container["image"] = image
        container["command"] = ["tini", "--", "sleep", "infinity"]
        container.pop("args", None)
    for container in spec["containers"]:
        container["imagePullPolicy"] = "Never"
    return [deployment]


def main() -> None:
    manifest, out, image = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    documents = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    out.mkdir(parents=True, exist_ok=True)
    (out / "index.yaml").write_text(yaml.safe_dump_all(index_documents(documents), sort_keys=False))
    (out / "app.yaml").write_text(yaml.safe_dump_all(app_documents(documents, image), sort_keys=False))


if __name__ == "__main__":
    main()
