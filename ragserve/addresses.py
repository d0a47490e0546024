"""Network addresses: which hosts are this machine's own (server, client and settings share it)."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def normalize_http_url(url: str) -> str:
    """One spelling per server: scheme and host in lower case, no default port, no trailing slash
    (`http://A:80/` and `http://a` are the same server)."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        return url.strip().rstrip("/")  # not a valid port: left for validation to refuse
    default = {"http": 80, "https": 443}.get(scheme)
    netloc = host if port in (None, default) else f"{host}:{port}"
    if parts.username or parts.password:
        netloc = parts.netloc.rsplit("@", 1)[0] + "@" + netloc
    path = parts.path.rstrip("/")
    return f"{scheme}://{netloc}{path}" + (f"?{parts.query}" if parts.query else "")
