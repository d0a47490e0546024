"""Prints `export` lines that hand uv the package sources pip is configured with.

deploy/local/setup.sh installs with uv (the same resolution as pip, in less time), but uv
does not read pip's configuration: the indexes, find-links, constraints and certificate that pip
would use (its config files and PIP_* variables, as `pip config list` shows them) become the UV_*
variables that mean the same. Run with the venv's python.
"""

from __future__ import annotations

import ast
import shlex
import subprocess
import sys

# pip's option -> (uv's variable, how uv separates several values).
_OPTIONS = {
    "index-url": ("UV_DEFAULT_INDEX", " "),
    "extra-index-url": ("UV_EXTRA_INDEX_URL", " "),
    "find-links": ("UV_FIND_LINKS", ","),
    "constraint": ("UV_CONSTRAINT", " "),
    "cert": ("SSL_CERT_FILE", " "),
}
# Later scopes override earlier ones, as in pip (its variables last).
_SCOPES = ("global", "user", "site", ":env:")


def exports(listed: str) -> list[str]:
    """The `export` lines for `pip config list`'s output."""
    chosen: dict[str, tuple[int, str]] = {}
    for line in listed.splitlines():
        key, _, raw = line.partition("=")
        scope, _, option = key.rpartition(".")
        if option not in _OPTIONS or scope not in _SCOPES:
            continue
        rank = _SCOPES.index(scope)
        if option not in chosen or rank >= chosen[option][0]:
            chosen[option] = (rank, str(ast.literal_eval(raw)))
    # pip looks for the best version across every index; uv's default stops at the first that has
    # the package.
    lines = ["export UV_INDEX_STRATEGY=unsafe-best-match"]
    for option, (_, value) in sorted(chosen.items()):
        name, separator = _OPTIONS[option]
        lines.append(f"export {name}={shlex.quote(separator.join(value.split()))}")
    return lines


def main() -> None:
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    print("\n".join(exports(listed)))


if __name__ == "__main__":
    main()
