"""Checksums a file per core or in a child process at a lower priority give the same digests, in
order, and a file that cannot be read is an OSError either way; dropping files from the page cache
is a hint that never fails."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from ragserve.digests import forget_cached, sha256_files


def test_every_way_of_hashing_gives_each_files_digest_in_order(tmp_path: Path) -> None:
    paths = []
    for i, size in enumerate((0, 1, 1 << 20, (3 << 20) + 7)):
        path = tmp_path / f"f{i}"
        path.write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
        paths.append(path)
    want = [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
    assert sha256_files(paths) == want
    assert sha256_files(paths, nice=5) == want
    assert sha256_files([]) == []


@pytest.mark.parametrize("nice", [0, 5])
def test_a_file_that_cannot_be_read_is_an_os_error(tmp_path: Path, nice: int) -> None:
    (tmp_path / "present").write_bytes(b"x")
    with pytest.raises(OSError):
        sha256_files([tmp_path / "present", tmp_path / "missing"], nice=nice)


def test_forgetting_cached_pages_is_only_a_hint(tmp_path: Path) -> None:
    present = tmp_path / "present"
    present.write_bytes(b"x" * 4096)
    forget_cached([present, tmp_path / "missing", tmp_path])
    assert present.read_bytes() == b"x" * 4096
