"""A Unix socket that nobody else can reach at any moment, even between bind and chmod.

bind(2) creates the socket file with the process umask (often 0755: anyone may connect), and grpc
offers no mode option. A temporary umask is process-wide, so it would also change files other
threads create meanwhile, and it covers grpc's bind only if that bind happens inside the window.
Instead the server binds inside a fresh 0700 directory next to the final path (connect(2) needs
search permission on every directory on the path, so only this user can reach it there), the socket
is made 0600, and only then hard-linked to the final path, which therefore never exists with a
looser mode. A hard link, unlike rename, fails when the final path already exists, so a server
that started meanwhile at the same path is never displaced.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ragserve.errors import ConfigError

SOCKET_MODE = 0o600
# sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107


@contextlib.contextmanager
def private_socket_path(final: Path) -> Iterator[Path]:
    """Yields the path to bind at; on a clean exit the bound socket is 0600 and at `final`.

    Bind (and start the server, if it binds later) inside the block."""
    try:
        private_dir = Path(tempfile.mkdtemp(prefix=".rs", dir=final.parent))  # mode 0700, ours alone
    except OSError as exc:
        raise ConfigError(f"cannot create the Unix socket {final}: {exc}") from exc
    bind_path = private_dir / "s"
    try:
        if len(os.fsencode(bind_path)) > MAX_SOCKET_PATH_BYTES:
            raise ConfigError(
                f"RAGSERVE_UDS_PATH {final}: its folder is too deep for a Unix socket path "
                f"(the server binds at {bind_path} first, over {MAX_SOCKET_PATH_BYTES} bytes)"
            )
        yield bind_path
        os.chmod(bind_path, SOCKET_MODE)
        try:
            os.link(bind_path, final)
        except FileExistsError:
            raise ConfigError(f"another server is already listening on {final}") from None
        except OSError as exc:
            if exc.errno != errno.EPERM:
                raise ConfigError(f"cannot create the Unix socket {final}: {exc}") from exc
            # A filesystem without hard links: rename is as atomic, only not exclusive.
            os.rename(bind_path, final)
    finally:
        shutil.rmtree(private_dir, ignore_errors=True)
