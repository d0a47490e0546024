"""Hostile index versions: a crafted hnsw.bin whose manifest vouches for it, file names that lead
out of the version folder, unlisted files, malformed manifests. Each is refused like a bad
checksum: a clear IndexLoadError, one log line on reload, the serving version stays."""

from __future__ import annotations

import logging
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from ragserve.digests import sha256_file
from ragserve.errors import IndexLoadError
from ragserve.index.format import CHUNKS_FILE, HNSW_FILE, MANIFEST, resolve_current
from ragserve.index.hnsw import HnswIndex
from ragserve.index.reload import FolderWatch, IndexReloader
from tests.fakes import FakeClock, FakeServing
from tests.index.tiny import publish_tiny, refresh_checksum, rewrite_manifest

REPO = Path(__file__).resolve().parents[2]
TEXTS = [f"passage {i} about topic {i % 7}" for i in range(64)]
FAR = 1_000_000  # an element id far past the end of a 64-element graph

# hnswlib's header (hnswalg.h saveIndex): where the fields this test edits sit.
_HEADER = struct.Struct("<QQQQQQiIQQQdQ")
_MAX_LEVEL_AT, _ENTRY_POINT_AT = 48, 52


def _header(data: bytearray) -> tuple:
    return _HEADER.unpack_from(data)


def _put_u32(data: bytearray, at: int, value: int) -> None:
    struct.pack_into("<I", data, at, value)


def far_level0_neighbour(data: bytearray) -> None:
    _put_u32(data, _HEADER.size + 4, FAR)  # element 0's first neighbour


def long_level0_list(data: bytearray) -> None:
    max_m0 = _header(data)[9]
    _put_u32(data, _HEADER.size, max_m0 + 500)  # element 0 claims more neighbours than it has room for


def far_entry_point(data: bytearray) -> None:
    _put_u32(data, _ENTRY_POINT_AT, FAR)


def max_level_above_the_entry_point(data: bytearray) -> None:
    level = struct.unpack_from("<i", data, _MAX_LEVEL_AT)[0]
    struct.pack_into("<i", data, _MAX_LEVEL_AT, level + 3)


def far_upper_neighbour(data: bytearray) -> None:
    count, per_element = _header(data)[2], _header(data)[3]
    pos = _HEADER.size + count * per_element
    for _ in range(count):
        size = struct.unpack_from("<I", data, pos)[0]
        if size:
            _put_u32(data, pos + 4, 1)  # level 1 list: one neighbour...
            _put_u32(data, pos + 8, FAR)  # ...far out of range
            return
        pos += 4
    raise AssertionError("the test graph has no upper levels")


CRAFTED = [
    far_level0_neighbour,
    long_level0_list,
    far_entry_point,
    max_level_above_the_entry_point,
    far_upper_neighbour,
]


def craft(root: Path, mutate: Callable[[bytearray], None]) -> None:
    """Edit the published hnsw.bin, then fix the manifest so the checksum passes."""
    path = resolve_current(root) / HNSW_FILE
    data = bytearray(path.read_bytes())
    mutate(data)
    path.write_bytes(bytes(data))
    refresh_checksum(root, HNSW_FILE)


# Load and search in a child: on code that lets such a file through, hnswlib may segfault, and that
# must fail this test, not kill the test run.
_LOAD_AND_SEARCH = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from ragserve.errors import IndexLoadError
    from ragserve.index.hnsw import HnswIndex
    from tests.index.tiny import unit_vectors
    try:
        index = HnswIndex.load(Path(sys.argv[1]))
    except IndexLoadError as exc:
        print("refused:", exc)
        sys.exit(0)
    for query in unit_vectors(50, seed=7):
        index.search(query, k=5, ef=64)
    print("served")
    sys.exit(3)
    """
)


def _load_in_child(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _LOAD_AND_SEARCH, str(root)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )


@pytest.mark.parametrize("mutate", CRAFTED, ids=lambda f: f.__name__)
def test_crafted_graph_passing_its_checksum_is_refused_before_hnswlib_reads_it(tmp_path: Path, mutate) -> None:
    root = tmp_path / "idx"
    publish_tiny(root, TEXTS)
    craft(root, mutate)
    child = _load_in_child(root)
    assert child.returncode == 0, f"exit {child.returncode}: {child.stdout} {child.stderr[-2000:]}"
    assert "refused:" in child.stdout and "not a valid HNSW graph" in child.stdout


def test_graph_of_other_dimension_than_the_manifest_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "idx"
    publish_tiny(root, TEXTS)
    rewrite_manifest(root, lambda data: data.__setitem__("dim", 16))  # hnswlib would read past each vector
    child = _load_in_child(root)
    assert child.returncode == 0, f"exit {child.returncode}: {child.stdout} {child.stderr[-2000:]}"
    assert "does not match 16-dimensional vectors" in child.stdout


def test_untouched_tiny_graph_loads_and_searches(tmp_path: Path) -> None:
    root = tmp_path / "idx"
    publish_tiny(root, TEXTS)
    assert _load_in_child(root).returncode == 3  # "served": the checks pass a real hnswlib file


def _reloader(root: Path, holder: FakeServing, clock: Callable[[], float] = lambda: 0.0) -> IndexReloader:
    return IndexReloader(FolderWatch(root), holder, clock=clock)


def test_hot_reload_refuses_a_crafted_graph_and_keeps_serving(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "idx"
    publish_tiny(root, TEXTS)
    holder = FakeServing(HnswIndex.load(root))
    reloader = _reloader(root, holder)
    publish_tiny(root, TEXTS, seed=1)
    craft(root, far_level0_neighbour)
    caplog.set_level(logging.INFO, logger="ragserve.index.reload")
    assert reloader.check_once() is False
    assert reloader.refused == 1 and reloader.reloads == 0 and holder.index.version == "1"
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and "not a valid HNSW graph" in errors[0].getMessage() and errors[0].exc_info is None


@pytest.mark.parametrize(
    "listed_as",
    ["../outside.txt", "{outside}", "sub/../../outside.txt", "link.txt"],
    ids=["parent", "absolute", "dotdot-inside", "symlink-out"],
)
def test_manifest_file_names_stay_inside_the_version_folder(tmp_path: Path, listed_as: str) -> None:
    root = tmp_path / "idx"
    folder = publish_tiny(root, TEXTS)
    outside = tmp_path / "idx" / "outside.txt"
    outside.write_text("not part of any version")
    (folder / "sub").mkdir()
    (folder / "link.txt").symlink_to(outside)
    name = listed_as.format(outside=outside)
    rewrite_manifest(root, lambda data: data["files"].__setitem__(name, sha256_file(outside)))
    with pytest.raises(IndexLoadError, match=r"outside its version folder|not a plain path"):
        HnswIndex.load(root)


def test_current_pointing_outside_the_root_is_refused(tmp_path: Path) -> None:
    elsewhere = publish_tiny(tmp_path / "elsewhere", TEXTS)
    root = tmp_path / "idx"
    publish_tiny(root, TEXTS)
    (root / "CURRENT").unlink()
    (root / "CURRENT").symlink_to(elsewhere)
    with pytest.raises(IndexLoadError, match="points outside"):
        HnswIndex.load(root)


@pytest.mark.parametrize("unlisted", [HNSW_FILE, CHUNKS_FILE, "bm25/vocab.index.json"])
def test_unlisted_files_are_not_loaded(tmp_path: Path, unlisted: str) -> None:
    root = tmp_path / "idx"
    publish_tiny(root, TEXTS, bm25=True)
    assert unlisted in HnswIndex.load(root).manifest.files
    rewrite_manifest(root, lambda data: data["files"].pop(unlisted))
    with pytest.raises(IndexLoadError, match="not listed"):
        HnswIndex.load(root)


MALFORMED: dict[str, Callable[[dict], object]] = {
    "files-a-list": lambda d: d.__setitem__("files", list(d["files"])),
    "dim-a-string": lambda d: d.__setitem__("dim", str(d["dim"])),
    "count-negative": lambda d: d.__setitem__("count", -1),
    "count-a-bool": lambda d: d.__setitem__("count", True),
    "hnsw-setting-a-string": lambda d: d["hnsw"].__setitem__("M", "four"),
    "checksum-not-hex": lambda d: d["files"].__setitem__(HNSW_FILE, ["not", "hex"]),
    "unknown-field": lambda d: d.__setitem__("exec", "rm -rf /"),
    "missing-count": lambda d: d.pop("count"),
}


@pytest.mark.parametrize("change", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_manifest_is_refused_once_with_one_line(
    tmp_path: Path, change: Callable[[dict], object], caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "idx"
    publish_tiny(root, TEXTS)
    holder = FakeServing(HnswIndex.load(root))
    clock = FakeClock(0.0)
    reloader = _reloader(root, holder, clock=clock)
    publish_tiny(root, TEXTS, seed=1)
    rewrite_manifest(root, change)
    with pytest.raises(IndexLoadError, match="corrupt"):
        HnswIndex.load(root)
    caplog.set_level(logging.INFO, logger="ragserve.index.reload")
    for _ in range(5):  # never retried: the version's verdict stands until something else is published
        assert reloader.check_once() is False
        clock.advance(120.0)
    assert reloader.refused == 1 and holder.index.version == "1"
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(errors) == 1 and errors[0].exc_info is None and "\n" not in errors[0].getMessage()


def test_deeply_nested_manifest_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "idx"
    publish_tiny(root, TEXTS)
    (resolve_current(root) / MANIFEST).write_text('{"format": 1, "chunking": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(IndexLoadError, match="corrupt"):
        HnswIndex.load(root)
