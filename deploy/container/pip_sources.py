"""Prints the `podman build` flags, one a line, that hand the image build the package sources pip is
configured with on this host.

deploy/container/build.sh builds the image with the same sources deploy/local/setup.sh installs from:
pip's index URLs, find-links, constraints and certificate (its config files' [global] and [install]
sections and its PIP_* variables, as `pip config list` shows them) become build arguments of the
same names (deploy/docker/Dockerfile.cpu declares them), and every local folder or file among them
(a `file://` index, a wheel folder) is mounted read-only into the build at the same path. torch's
CPU build: TORCH_INDEX_URL when set; else empty (pip's sources) when they resolve torch to a `+cpu`
build; else nothing, and the Dockerfile's default (PyTorch's CPU index) holds.

Usage: python deploy/container/pip_sources.py TORCH_VERSION   (with the python whose pip is configured)
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# pip's options carried into the build, each as its PIP_* variable.
_OPTIONS = ("index-url", "extra-index-url", "find-links", "constraint", "cert")
# Later sections override earlier ones, as in `pip install`.
_SCOPES = ("global", "user", "site", "install", ":env:")


def chosen(listed: str) -> dict[str, str]:
    """pip's effective value of each carried option in `pip config list`'s output."""
    found: dict[str, tuple[int, str]] = {}
    for line in listed.splitlines():
        key, _, raw = line.partition("=")
        scope, _, option = key.rpartition(".")
        if option not in _OPTIONS or scope not in _SCOPES:
            continue
        rank = _SCOPES.index(scope)
        if option not in found or rank >= found[option][0]:
            found[option] = (rank, str(ast.literal_eval(raw)))
    return {option: value for option, (_, value) in found.items()}


def local_path(value: str) -> str | None:
    """The host path to mount for a source (a `file://` URL or an absolute path), or None for a
    remote one. A local index's pages link to its files beside `simple/` (`../../files/...`): the
    folder above `simple` is mounted."""
    path = value[len("file://") :] if value.startswith("file://") else value
    if not path.startswith("/"):
        return None
    path = path.rstrip("/") or "/"
    return str(Path(path).parent) if Path(path).name == "simple" else path


def flags(options: dict[str, str], torch_index: str | None) -> list[str]:
    """The build's flags: a build argument per option, a read-only mount per local path."""
    lines: list[str] = []
    mounts: list[str] = []  # host paths, mounted at the same place in the build
    for option in _OPTIONS:
        if option not in options:
            continue
        value = " ".join(options[option].split())
        lines.append(f"--build-arg=PIP_{option.upper().replace('-', '_')}={value}")
        for part in value.split():
            path = local_path(part)
            if path and Path(path).exists() and path not in mounts:
                mounts.append(path)
    lines += [f"--volume={path}:{path}:ro" for path in mounts]
    if torch_index is not None:
        lines.append(f"--build-arg=TORCH_INDEX_URL={torch_index}")
    return lines


def configured_cpu_torch(version: str) -> bool:
    """Whether pip's own sources resolve torch==version to its +cpu build (metadata only: a dry run
    never downloads the CUDA build)."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        dry_run = ["install", "--dry-run", "--quiet", "--no-deps", "--ignore-installed", "--report", str(report)]
        result = subprocess.run(
            [sys.executable, "-m", "pip", *dry_run, f"torch=={version}"],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0 or not report.exists():
            return False
        for item in json.loads(report.read_text()).get("install", []):
            metadata = item.get("metadata", {})
            if metadata.get("name", "").lower() == "torch" and metadata.get("version", "").endswith("+cpu"):
                return True
    return False


def main() -> None:
    version = sys.argv[1]
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    torch_index = os.environ.get("TORCH_INDEX_URL")
    if torch_index is None and configured_cpu_torch(version):
        torch_index = ""
    print("\n".join(flags(chosen(listed), torch_index)))


if __name__ == "__main__":
    main()
