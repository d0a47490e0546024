"""The sidecar in a real container engine: the CPU image built with podman, the Kubernetes sidecar
manifest played as a pod (deploy/container/pod.sh), a question from the app container over the Unix
socket, and a clean drain when the pod stops.

Its own lane in CI (deploy/local/test.sh, marker `container`); a plain `pytest` leaves it out. It
needs podman (and root to install it, runc and mmdebstrap from Debian's packages): without them it
skips, except in CI (CI=true), where it fails instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# A cold image build (a fresh machine) takes longer than pytest's default bound (pyproject.toml).
pytestmark = [pytest.mark.container, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
POD_SH = REPO / "deploy" / "container" / "pod.sh"
POD = "app-with-ragserve-pod-0"
SIDECAR = f"{POD}-ragserve"
APP = f"{POD}-app"
SOCKET = "/run/ragserve/ragserve.sock"
SERVICE_UID = 10001
QUESTION = "How does the honey bee waggle dance encode the direction and distance of food?"

# Run in the app container: the Python client over the socket, each event with its arrival time.
CLIENT = f"""
import asyncio, json, time
from ragserve.client import RagClient

async def main():
    events = []
    async with RagClient("unix:{SOCKET}") as client:
        await client.wait_ready(timeout_s=60)
        started = time.monotonic()
        async for event in client.query({QUESTION!r}, max_tokens=48, timeout_s=120):
            kind = event.WhichOneof("event")
            text = event.token.text if kind == "token" else ""
            finish = event.final.finish_reason if kind == "final" else ""
            events.append({{"kind": kind, "at": time.monotonic() - started, "text": text, "finish": finish}})
    print(json.dumps(events))

asyncio.run(main())
"""


def _unavailable() -> str | None:
    """Why this host cannot run the pod, or None."""
    if shutil.which("podman") is None and os.geteuid() != 0:
        return "podman is not installed and installing it (apt-get install podman runc catatonit mmdebstrap) needs root"
    if shutil.which("apt-get") is None and shutil.which("podman") is None:
        return "podman is not installed and there is no apt-get to install it"
    return None


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(REPO / "deploy" / "container" / "containers.conf"))
    return env


def _podman(*args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["podman", *args], input=stdin, capture_output=True, text=True, env=_env(), timeout=300)
    if check:
        assert result.returncode == 0, f"podman {' '.join(args)}: {result.stdout}{result.stderr}"
    return result


def _report(config: pytest.Config, line: str) -> None:
    """A measured figure on the lane's report (pytest captures the test's own output)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"container: {line}")


@pytest.fixture(scope="module")
def pod(pytestconfig: pytest.Config) -> Iterator[float]:
    """The pod up and SERVING; yields the seconds from `kube play` to SERVING. Removed afterwards."""
    reason = _unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the container lane: {reason}")
        pytest.skip(reason)
    args = ["--local-base"] if not os.environ.get("BASE_IMAGE") else []
    started = time.monotonic()
    up = subprocess.run(["bash", str(POD_SH), "up", *args], capture_output=True, text=True, env=_env(), timeout=1500)
    try:
        assert up.returncode == 0, up.stdout[-6000:] + up.stderr[-6000:]
        built = re.search(r"^build: .* in (\d+) s, (\d+) MB$", up.stdout, re.MULTILINE)
        index = re.search(r"^pod: index built in (\d+) s$", up.stdout, re.MULTILINE)
        serving = re.search(r"^pod: \S+ SERVING (\d+) s after kube play$", up.stdout, re.MULTILINE)
        assert built and index and serving, up.stdout[-3000:]
        _report(
            pytestconfig,
            f"image build {built.group(1)} s, {built.group(2)} MB; first index {index.group(1)} s; "
            f"pod SERVING {serving.group(1)} s after kube play; up in {time.monotonic() - started:.0f} s",
        )
        yield float(serving.group(1))
    finally:
        subprocess.run(["bash", str(POD_SH), "down"], capture_output=True, text=True, env=_env(), timeout=300)


def test_the_sidecar_runs_as_a_non_root_user_on_a_read_only_root(pod: float) -> None:
    assert _podman("inspect", "--format", "{{.HostConfig.ReadonlyRootfs}}", SIDECAR).stdout.strip() == "true"
    # Every process of the sidecar (tini as PID 1, ragserve, the engine's), by the kernel's account.
    uids = _podman("exec", SIDECAR, "sh", "-c", "grep -h '^Uid:' /proc/[0-9]*/status").stdout.split("\n")
    real_and_effective = {tuple(line.split()[1:3]) for line in uids if line}
    assert real_and_effective == {(str(SERVICE_UID), str(SERVICE_UID))}, real_and_effective
    # Neither the code, nor the weights, nor anything else on the root can be changed.
    for path in ("/opt/ragserve/written", "/opt/venv/written", "/written"):
        refused = _podman("exec", SIDECAR, "touch", path, check=False)
        assert refused.returncode != 0 and "Read-only file system" in refused.stderr, refused
    # What it may write: its volumes (the socket's, the counts', the scratch space).
    _podman("exec", SIDECAR, "sh", "-c", "touch /tmp/w /var/cache/ragserve/w /var/lib/ragserve/state/w")
    # The index is mounted read-only.
    assert _podman("exec", SIDECAR, "touch", "/var/lib/ragserve/index/w", check=False).returncode != 0


def test_the_app_container_gets_a_streamed_answer_over_the_socket(pod: float, pytestconfig: pytest.Config) -> None:
    # The socket lives in the volume the two containers share, and only the service user may open it.
    _podman("exec", APP, "test", "-S", SOCKET)
    assert _podman("exec", APP, "stat", "-c", "%u %a", SOCKET).stdout.split() == [str(SERVICE_UID), "600"]

    # The Python client: one retrieval event, the answer in several token events, one final event.
    events = json.loads(_podman("exec", "-i", APP, "python3", "-", stdin=CLIENT).stdout.splitlines()[-1])
    kinds = [event["kind"] for event in events]
    assert kinds[0] == "retrieval" and kinds[-1] == "final", kinds
    tokens = [event for event in events if event["kind"] == "token"]
    assert len(tokens) >= 2 and "".join(t["text"] for t in tokens).strip(), events
    # Streamed: the tokens arrived one by one, not all at once with the final event.
    assert tokens[-1]["at"] - tokens[0]["at"] > 0.005, tokens
    assert events[-1]["finish"] in {"stop", "length"}, events[-1]
    _report(
        pytestconfig, f"the client's answer: {len(tokens)} token events over {tokens[-1]['at'] - tokens[0]['at']:.2f} s"
    )

    # The CLI the README shows, in the app container, over the socket.
    asked = _podman("exec", APP, "ragserve", "ask", "--uds", SOCKET, QUESTION)
    assert "answer:" in asked.stdout and "ttft" in asked.stdout and "finish:" in asked.stdout, asked.stdout


def test_stopping_the_pod_drains_the_sidecar_and_it_exits_0(pod: float, pytestconfig: pytest.Config) -> None:
    started = time.monotonic()
    _podman("pod", "stop", "--time", "30", POD)
    stopped_s = time.monotonic() - started
    state = json.loads(_podman("inspect", "--format", "{{json .State}}", SIDECAR).stdout)
    assert state["Status"] == "exited" and state["ExitCode"] == 0, state
    # Its own account: health went NOT_SERVING, calls drained within the grace, and it stopped.
    messages = []
    for line in _podman("logs", SIDECAR).stderr.splitlines() + _podman("logs", SIDECAR).stdout.splitlines():
        try:
            messages.append(json.loads(line).get("message", ""))
        except ValueError:
            continue
    assert any(m.startswith("shutting down (grace") for m in messages), messages[-10:]
    assert messages.count("stopped") >= 1, messages[-10:]
    assert stopped_s < 30, f"the pod took {stopped_s:.1f} s to stop: SIGTERM did not reach ragserve"
    _report(pytestconfig, f"the pod stopped in {stopped_s:.1f} s, the sidecar exited 0")
