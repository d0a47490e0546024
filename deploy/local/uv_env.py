"""Prints `export` lines that hand uv the package sources pip is configured with.

deploy/local/setup.sh installs with uv (the same resolution as pip, in less time), but uv
does not read pip's configuration: the indexes, find-links, constraints, certificate, `no-index` and
`require-hashes` that pip would use (its config files' [global] and [install] sections and PIP_*
variables, as `pip config list` shows them) become the UV_* variables that mean the same. Run with
the venv's python; when it fails, setup.sh installs with pip (never uv without pip's sources).
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
# pip's switches -> uv's variable, set to 1 when pip's is on.
_SWITCHES = {"no-index": "UV_NO_INDEX", "require-hashes": "UV_REQUIRE_HASHES"}
_ON = {"1", "true", "yes", "on"}
# pip's wheel-or-source choices (only-binary, no-binary): `uv pip install` reads them from no
# variable, so uv would build a source distribution pip refuses (or take a wheel pip would build).
# Set, they stop this helper: setup.sh then installs with pip itself.
_NOT_CARRIED = ("only-binary", "no-binary")
# Later sections override earlier ones, as in `pip install` ([global], then [install], then its
# PIP_* variables); `user` and `site` name files in older pip output.
_SCOPES = ("global", "user", "site", "install", ":env:")


def exports(listed: str) -> list[str]:
    """The `export` lines for `pip config list`'s output."""
    chosen: dict[str, tuple[int, str]] = {}
    for line in listed.splitlines():
        key, _, raw = line.partition("=")
        scope, _, option = key.rpartition(".")
        if option in _NOT_CARRIED and scope in _SCOPES and str(ast.literal_eval(raw)).strip():
            raise SystemExit(f"uv_env.py: pip's {option} has no uv variable; install with pip")
        if (option not in _OPTIONS and option not in _SWITCHES) or scope not in _SCOPES:
            continue
        rank = _SCOPES.index(scope)
        if option not in chosen or rank >= chosen[option][0]:
            chosen[option] = (rank, str(ast.literal_eval(raw)))
    lines = []
    if "extra-index-url" in chosen:
        # pip looks for the best version across every index it is given; uv's default stops at the
        # first that has the package. The same choice as pip, with pip's own dependency-confusion
        # exposure: configure one index (a mirror that proxies the others) to avoid both.
        lines.append("export UV_INDEX_STRATEGY=unsafe-best-match")
    for option, (_, value) in sorted(chosen.items()):
        if option in _SWITCHES:
            if value.strip().lower() in _ON:
                lines.append(f"export {_SWITCHES[option]}=1")
            continue
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
