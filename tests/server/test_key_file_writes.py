"""`ragserve keys add/revoke` rewrite the key file: they keep its owner and mode (a server running
as another user still reads it), two at once lose nothing, and the file and its folder are synced
around the rename."""

from __future__ import annotations

import multiprocessing
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from ragserve import api_keys
from ragserve.api_keys import add_key, read_keys, revoke_keys

OTHER_GID = 4242  # a group nobody here is in: only root may give the file to it


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_key_file_is_0600(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "keys"
    add_key(path, "app")
    assert _mode(path) == 0o600


def test_add_and_revoke_keep_the_file_mode(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    add_key(path, "app")
    path.chmod(0o640)
    add_key(path, "other")
    assert _mode(path) == 0o640
    revoke_keys(path, "app")
    assert _mode(path) == 0o640 and [e.name for e in read_keys(path)] == ["other"]


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may give a file to another group")
def test_add_and_revoke_keep_the_file_owner(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    add_key(path, "app")
    os.chown(path, 0, OTHER_GID)
    path.chmod(0o640)
    add_key(path, "other")
    assert (path.stat().st_gid, _mode(path)) == (OTHER_GID, 0o640)
    revoke_keys(path, "app")
    assert (path.stat().st_gid, _mode(path)) == (OTHER_GID, 0o640)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may give a file to another group")
def test_an_owner_that_cannot_be_kept_leaves_the_file_alone(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "keys"
    add_key(path, "app")
    os.chown(path, 0, OTHER_GID)
    before = path.read_bytes()

    def refused(fd: int, uid: int, gid: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(api_keys.os, "fchown", refused)
    with pytest.raises(PermissionError, match="cannot keep its owner"):
        add_key(path, "other")
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keys", "keys.lock"]  # no temp file left


def _slow_reads(monkeypatch) -> None:
    """Each read of the file lingers, so that two commands at once overlap from read to rename."""
    real = api_keys.read_keys

    def slow(path: Path) -> tuple[api_keys.KeyEntry, ...]:
        entries = real(path)
        time.sleep(0.2)
        return entries

    monkeypatch.setattr(api_keys, "read_keys", slow)


def test_two_commands_at_once_both_land(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "keys"
    add_key(path, "revoked")
    _slow_reads(monkeypatch)
    threads = [
        threading.Thread(target=add_key, args=(path, "new")),
        threading.Thread(target=revoke_keys, args=(path, "revoked")),
        threading.Thread(target=add_key, args=(path, "newer")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(e.name for e in read_keys(path)) == ["new", "newer"]  # the revocation holds too


def _add_some(path: Path, prefix: str) -> None:
    for n in range(10):
        add_key(path, f"{prefix}-{n}")


def test_processes_adding_at_once_lose_no_key(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_add_some, args=(path, f"p{i}")) for i in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    assert len(read_keys(path)) == 40


def test_the_new_file_is_synced_before_the_rename_and_its_folder_after(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "keys"
    add_key(path, "app")
    steps: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        steps.append("fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(source: str, target: Path) -> None:
        steps.append("rename")
        real_replace(source, target)

    monkeypatch.setattr(api_keys.os, "fsync", fsync)
    monkeypatch.setattr(api_keys.os, "replace", replace)
    add_key(path, "other")
    assert steps == ["fsync file", "rename", "fsync folder"]
    steps.clear()
    revoke_keys(path, "app")
    assert steps == ["fsync file", "rename", "fsync folder"]
