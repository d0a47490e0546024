"""Logging set-up for entry points: JSON lines by default, with request ids and no document text."""

from __future__ import annotations

import logging
import os
import sys

from pythonjsonlogger.json import JsonFormatter


def setup_logging(default_format: str = "json") -> None:
    level = os.environ.get("RAGSERVE_LOG_LEVEL", "INFO").upper()
    fmt = os.environ.get("RAGSERVE_LOG_FORMAT", default_format)
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(
            JsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s",
                rename_fields={"asctime": "ts", "levelname": "level", "name": "logger"},
            )
        )
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
