"""Named API keys (RAGSERVE_API_KEYS_FILE): a key names its caller, as a client certificate does.

The file holds one line per key: the caller's name, the key's SHA-256 and an optional expiry,

    billing-app  sha256:5e88...  expires=2027-06-30
    support-bot  sha256:9f86...

never the key itself. `ragserve keys add NAME` makes a random key (256 bits, so a plain hash is
enough: there is nothing to guess), prints it once and appends its line; `ragserve keys revoke
NAME [--fingerprint F]` removes the name's lines (or one of them, to finish a rotation); both
keep the file's owner and mode and hold a lock beside it (`<file>.lock`) from read to rename. The
server re-reads the file when it changes, so a revoked key stops working within seconds; a file
that turns unreadable or malformed lets no key in until it is fixed (logged), never an old key
list.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import hmac
import logging
import os
import re
import secrets
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

KEY_PREFIX = "rsk_"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,127}")
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
# How often a server looks at the file's stat on use: a revoked key lasts at most this long.
CHECK_EVERY_S = 1.0


def check_name(name: str) -> str:
    """A caller name a key may carry: letters, digits and . _ @ - (grants and limits name it)."""
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"caller name {name!r}: use 1-128 letters, digits or . _ @ - (starting with a letter or digit)"
        )
    return name


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def digest_of(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


@dataclass(frozen=True)
class KeyEntry:
    name: str
    digest: bytes
    expires: dt.date | None = None

    def line(self) -> str:
        expiry = f"  expires={self.expires.isoformat()}" if self.expires else ""
        return f"{self.name}  sha256:{self.digest.hex()}{expiry}"

    @property
    def fingerprint(self) -> str:
        """What tells two keys of one name apart in `keys list` and `keys revoke` (a hash's prefix:
        nothing a key can be made from)."""
        return self.digest.hex()[:12]

    def expired(self, today: dt.date) -> bool:
        return self.expires is not None and today > self.expires


def parse_keys(text: str, source: str) -> tuple[KeyEntry, ...]:
    """Every key line of a key file (blank lines and # comments skipped); ValueError naming the line."""
    entries = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        found = _DIGEST.fullmatch(parts[1]) if len(parts) in (2, 3) else None
        if found is None or (len(parts) == 3 and not parts[2].startswith("expires=")):
            raise ValueError(f"{source}:{number}: expected 'NAME sha256:HEX [expires=YYYY-MM-DD]'")
        try:
            name = check_name(parts[0])
            expires = dt.date.fromisoformat(parts[2].removeprefix("expires=")) if len(parts) == 3 else None
        except ValueError as exc:
            raise ValueError(f"{source}:{number}: {exc}") from None
        entries.append(KeyEntry(name, bytes.fromhex(found.group(1)), expires))
    return tuple(entries)


def read_keys(path: Path) -> tuple[KeyEntry, ...]:
    return parse_keys(path.read_text(encoding="utf-8"), str(path)) if path.exists() else ()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `<file>.lock` beside the key file, held across a read-modify-write: two
    commands at once would otherwise each write the list it read, undoing the other's change."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Read-only is enough for flock; 0644 lets a command run as another user open it too.
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _keep_owner_and_mode(fd: int, path: Path) -> None:
    """The old file's owner and mode on the new one (a 0640 root:app file stays readable by a server
    running as app); a new file: 0600. Refused, with the file unchanged, when they cannot be kept."""
    try:
        old = path.stat()
    except FileNotFoundError:
        os.fchmod(fd, 0o600)
        return
    new = os.fstat(fd)
    if (new.st_uid, new.st_gid) != (old.st_uid, old.st_gid):
        try:
            os.fchown(fd, old.st_uid, old.st_gid)
        except PermissionError:
            raise PermissionError(
                f"{path}: cannot keep its owner {old.st_uid}:{old.st_gid}; run the command as that user or root"
            ) from None
    os.fchmod(fd, stat.S_IMODE(old.st_mode))  # after fchown, which may clear set-id bits


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_keys(path: Path, entries: tuple[KeyEntry, ...]) -> None:
    """Written whole and renamed over the old file (a server never reads half a file); the new file
    is on disk before the rename and the rename once the folder is synced (a crash leaves the old
    list or the new one, never an empty file). Call it holding `_locked(path)`."""
    fd, temp = tempfile.mkstemp(prefix=".keys-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("".join(entry.line() + "\n" for entry in entries))
            f.flush()
            _keep_owner_and_mode(f.fileno(), path)
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)


def add_key(path: Path, name: str, expires: dt.date | None = None) -> str:
    """A new key for `name` (a name may hold several, to rotate one without a gap); returned once."""
    key = new_key()
    entry = KeyEntry(check_name(name), digest_of(key), expires)
    with _locked(path):
        _write_keys(path, (*read_keys(path), entry))
    return key


def revoke_keys(path: Path, name: str, fingerprint: str = "") -> int:
    """Removes the keys of `name` (only the one whose fingerprint starts so, when given: the old key
    of a rotation); how many there were."""
    with _locked(path):
        entries = read_keys(path)
        kept = tuple(e for e in entries if not (e.name == name and e.fingerprint.startswith(fingerprint)))
        if len(kept) != len(entries):
            _write_keys(path, kept)
    return len(entries) - len(kept)


class KeyFile:
    """The key file as a server reads it: looked at on use at most once a second, re-read when its
    stat changes. Raises at start when it cannot be read; later, a bad file lets no key in."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such key file (RAGSERVE_API_KEYS_FILE)")
        self._path = path
        self._clock = clock
        self._stamp = self._stat()
        self._entries = read_keys(path)  # at start a bad file is the operator's mistake: it raises
        self._looked = clock()

    def _stat(self) -> tuple[int, int, int, int] | None:
        try:
            st = self._path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def _refresh(self) -> None:
        now = self._clock()
        if now - self._looked < CHECK_EVERY_S:
            return
        self._looked = now
        stamp = self._stat()
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            self._entries = read_keys(self._path) if stamp is not None else ()
        except (OSError, ValueError) as exc:
            self._entries = ()
            log.error("the API key file is unreadable; no key is accepted until it is fixed: %s", exc)
            return
        log.info("API keys re-read: %d keys", len(self._entries))

    def name_of(self, key: bytes) -> str | None:
        """The caller `key` names, None when it names none (unknown, revoked or expired alike).
        Every entry is compared, in constant time each, whichever matches."""
        self._refresh()
        digest, today = digest_of(key), dt.datetime.now(dt.UTC).date()
        found = None
        for entry in self._entries:
            if hmac.compare_digest(digest, entry.digest) and not entry.expired(today):
                found = entry.name
        return found
