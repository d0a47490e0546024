"""Logging set-up for entry points.

The server: JSON lines by default, with request ids and no document text. The command-line tools
(the indexer, prepare-models): a person's console shows our own lines, progress bars and results,
and third-party libraries only at WARNING or above; their INFO chatter (the ONNX quantizer alone logs
a line per tensor) goes to the log file when one is given, or to the console with --verbose.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from pythonjsonlogger.json import JsonFormatter

# Loggers under these names are ours; every other logger (and the root logger, which some libraries
# call directly) is third-party.
OWN_LOGGERS = ("ragserve", "indexer", "__main__")
# Python warnings (deprecations, tracer notes) once routed through logging by captureWarnings.
WARNINGS_LOGGER = "py.warnings"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _formatter(fmt: str) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "ts", "levelname": "level", "name": "logger"},
        )
    return logging.Formatter(TEXT_FORMAT)


def _replace_root_handlers(handlers: list[logging.Handler], level: int) -> None:
    root = logging.getLogger()
    for old in root.handlers:
        if old not in handlers:
            old.close()
    root.handlers[:] = handlers
    root.setLevel(level)


# Third-party lines dropped knowingly at the default level: each is expected on the hosts this
# runs on and leaves an operator nothing to do (`serve --verbose` shows them).
KNOWN_NOISE: tuple[tuple[str, str], ...] = (
    # The prepared model folder is float32 and a bf16 host downcasts it: one line per weight.
    ("vllm", "Attempted to load weight"),
    # The CPU build's optional accelerations (tcmalloc, Intel OpenMP, Triton) are not installed.
    ("vllm", "libtcmalloc is not found"),
    ("vllm", "libiomp is not found"),
    ("vllm", "Speculative decoding on CPU without Intel OpenMP"),
    ("vllm", "Triton is not installed"),
    ("vllm", "Triton is installed, but"),
    ("vllm", "Model Runner V2 requires Triton"),
    # Consequences of settings the server chose on purpose (eager mode, n-gram speculation, a seed).
    ("vllm", "Enforce eager set"),
    ("vllm", "Inductor compilation was disabled"),
    ("vllm", "Async scheduling not supported with ngram"),
    ("vllm", "max_num_scheduled_tokens is set"),
    ("vllm", "min_p and logit_bias parameters won't work with speculative decoding"),
    ("vllm", "The global random seed is set"),
    ("vllm", "Reset SSM cache type"),
    ("vllm", "CPU backend doesn't allow to use `torch.set_num_threads`"),
    ("vllm", "Passing raw prompts to InputProcessor is deprecated"),
)


class NoiseFilter(logging.Filter):
    """Drops the KNOWN_NOISE lines (and nothing else)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if is_own(record.name):
            return True
        message = record.getMessage()
        return not any(
            (record.name == name or record.name.startswith(name + ".")) and message.startswith(prefix)
            for name, prefix in KNOWN_NOISE
        )


def setup_logging(default_format: str = "json", verbose: bool = False) -> None:
    """The server: one stream (stderr), one format, ours and third-party libraries' lines alike.

    Our loggers log at RAGSERVE_LOG_LEVEL; third-party ones at WARNING, less the KNOWN_NOISE (at
    INFO and with everything with `verbose`). vLLM is told not to set up logging of its own, so
    its lines come through these handlers (in our format, on our stream) instead of its own.
    """
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    own_level = _level(os.environ.get("RAGSERVE_LOG_LEVEL", "INFO"))
    third_party_level = min(own_level, logging.INFO) if verbose else logging.WARNING
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_formatter(os.environ.get("RAGSERVE_LOG_FORMAT", default_format)))
    handler.addFilter(ConsoleFilter(own_level, third_party_level))
    if not verbose:
        handler.addFilter(NoiseFilter())
    _replace_root_handlers([handler], min(own_level, third_party_level))
    logging.captureWarnings(True)  # Python warnings: third-party notes, shown with `verbose`


def is_own(logger_name: str) -> bool:
    return any(logger_name == own or logger_name.startswith(own + ".") for own in OWN_LOGGERS)


class ConsoleFilter(logging.Filter):
    """Our records from `own_level`, third-party records from `third_party_level`.

    Python warnings count as third-party INFO: they are notes for developers (a deprecated
    argument, a tracer remark), not something a person running a command can act on.
    """

    def __init__(self, own_level: int, third_party_level: int) -> None:
        super().__init__()
        self.own_level = own_level
        self.third_party_level = third_party_level

    def filter(self, record: logging.LogRecord) -> bool:
        if is_own(record.name):
            return record.levelno >= self.own_level
        level = logging.INFO if record.name == WARNINGS_LOGGER else record.levelno
        return level >= self.third_party_level


def _level(name: str) -> int:
    level = logging.getLevelName(name.upper())
    if not isinstance(level, int):
        raise ValueError(f"unknown log level {name!r}")
    return level


def setup_cli_logging(verbose: bool = False, log_file: Path | None = None, own_default: str = "INFO") -> None:
    """Console and optional log file for a command-line tool.

    Our own loggers log at RAGSERVE_LOG_LEVEL (else `own_default`) to the console; third-party
    loggers at WARNING, or at INFO with `verbose`. `log_file`, when given, gets every record at INFO
    or above (DEBUG if asked for), ours and third-party, Python warnings included.
    """
    own_level = _level(os.environ.get("RAGSERVE_LOG_LEVEL", own_default))
    if verbose:
        own_level = min(own_level, logging.INFO)
    third_party_level = min(own_level, logging.INFO) if verbose else logging.WARNING
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(_formatter(os.environ.get("RAGSERVE_LOG_FORMAT", "text")))
    console.addFilter(ConsoleFilter(own_level, third_party_level))
    handlers: list[logging.Handler] = [console]
    root_level = min(own_level, third_party_level)
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        file_level = min(own_level, logging.INFO)
        to_file = logging.FileHandler(log_file, encoding="utf-8")
        to_file.setFormatter(logging.Formatter(TEXT_FORMAT))
        to_file.setLevel(file_level)
        handlers.append(to_file)
        root_level = min(root_level, file_level)
    _replace_root_handlers(handlers, root_level)
    logging.captureWarnings(True)
