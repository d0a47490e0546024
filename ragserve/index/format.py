"""The on-disk index format: versioned folders, a manifest with checksums, atomic publish.

Layout of an index root:

    <root>/CURRENT        symlink to the published version folder (replaced atomically)
    <root>/v000003/       manifest.json, hnsw.bin, chunks.jsonl, vectors.npy, documents.jsonl, bm25/
    <root>/.build-*/      a build in progress (ignored; removed by the next build)
    <root>/.checkpoints/  embedded groups of an unfinished build (the indexer's; never served)

A reader resolves CURRENT once and then only touches that folder, so a publish never changes
files under a running server.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ragserve.digests import sha256_files
from ragserve.errors import IndexLoadError
from ragserve.filters import FIELD_TYPES
from ragserve.priority import BACKGROUND_NICE

# 2: docstore records carry their sentences as analysed at build time, and the manifest's `hnsw`
# the search breadth measured for the graph (ef_search). A server reads both; format 1 versions
# are served as before (sentences analysed on first use, ef from settings).
# 3: each docstore record says where its chunk stands in its source (locator, PDF page, section
# path: ragserve/source_location.py); a format 1 or 2 version is served with citations that
# say they have no location, and an incremental build over one re-chunks every document.
FORMAT_VERSION = 3
READABLE_FORMATS = (1, 2, 3)
MANIFEST = "manifest.json"
CURRENT = "CURRENT"
HNSW_FILE = "hnsw.bin"
CHUNKS_FILE = "chunks.jsonl"
# Added with incremental builds and BM25; an index without them still loads (dense-only, full rebuild).
VECTORS_FILE = "vectors.npy"
DOCUMENTS_FILE = "documents.jsonl"


@dataclass(frozen=True)
class Manifest:
    version: int
    embedder_id: str
    dim: int
    count: int
    files: dict[str, str]  # file name -> sha256 hex
    space: str = "cosine"
    hnsw: dict[str, int] = field(default_factory=dict)
    chunking: dict[str, Any] = field(default_factory=dict)
    documents: int = 0
    created_at: str = ""
    format: int = FORMAT_VERSION
    # BM25 settings when the version has a lexical index (files under bm25/, listed in `files`).
    bm25: dict[str, Any] = field(default_factory=dict)
    embedder_backend: str = ""
    # A version whose corpus was re-embedded with a tuned bi-encoder ships that model (ONNX int8 and
    # its tokenizer, every file listed in `files`): {"dir", "onnx", "base", "max_seq_length"}. The
    # server embeds queries for this version with it (ragserve/embed/tuned.py). Empty: the
    # configured embedder, as before.
    tuned_embedder: dict[str, Any] = field(default_factory=dict)
    # A tuned cross-encoder for this version (ONNX int8 and its tokenizer, every file listed):
    # {"dir", "onnx", "base", "layers", "max_seq_len", "ce_weight", "beats_fused"}. The server may
    # rerank this version with it (ragserve/rerank/tuned.py, RAGSERVE_RERANK_MODE). Empty: none.
    tuned_reranker: dict[str, Any] = field(default_factory=dict)
    # What the tuner did and fitted (method, fusion_dense_weight, times, held-back scores).
    tuning: dict[str, Any] = field(default_factory=dict)
    # Filterable metadata fields: name -> keyword, integer, float, bool or datetime (ragserve/filters.py).
    # Every chunk's values were checked against these types at build time. Empty: no filters.
    fields: dict[str, str] = field(default_factory=dict)
    # The version whose graph this one's extends: the indexer added rows `rows`.. to that graph and
    # changed nothing else in it. {"identity": that version's manifest identity, "rows": its count}.
    # A server serving that version may grow its graph instead of loading this one's (graph_process.py).
    graph_base: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        """ValueError naming the first thing wrong: every field is checked before anything trusts it."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("manifest is not a JSON object")
        if data.get("format") not in READABLE_FORMATS:
            raise ValueError(
                f"unsupported index format {data.get('format')!r}: this server reads formats "
                f"{', '.join(map(str, READABLE_FORMATS))} (a newer indexer wrote it: upgrade the server)"
            )
        unknown = sorted(set(data) - set(_FIELD_TYPES))
        if unknown:
            raise ValueError(f"unknown field {unknown[0]!r}")
        for name in _REQUIRED_FIELDS:
            if name not in data:
                raise ValueError(f"missing field {name!r}")
        for name, value in data.items():
            kind = _FIELD_TYPES[name]
            # bool is an int to isinstance: a count must be a real int.
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ValueError(f"field {name!r} is {type(value).__name__}, not {kind.__name__}")
            if isinstance(value, int) and value < (1 if name == "dim" else 0):
                raise ValueError(f"field {name!r} is out of range: {value}")
        for name, digest in data["files"].items():
            check_file_name(name)
            if not isinstance(digest, str) or not _SHA256_HEX.fullmatch(digest):
                raise ValueError(f"checksum of {name!r} is not a sha256 hex digest")
        for name, kind in data.get("fields", {}).items():
            if not isinstance(name, str) or not name or kind not in FIELD_TYPES:
                raise ValueError(f"filterable field {name!r} has type {kind!r}, not one of {', '.join(FIELD_TYPES)}")
        _check_graph_base(data.get("graph_base", {}), data["count"])
        for name, value in data.get("hnsw", {}).items():
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"hnsw setting {name!r} is not an int")
        return cls(**data)


_FIELD_TYPES: dict[str, type] = {
    "version": int,
    "embedder_id": str,
    "dim": int,
    "count": int,
    "files": dict,
    "space": str,
    "hnsw": dict,
    "chunking": dict,
    "documents": int,
    "created_at": str,
    "format": int,
    "bm25": dict,
    "embedder_backend": str,
    "tuned_embedder": dict,
    "tuned_reranker": dict,
    "tuning": dict,
    "fields": dict,
    "graph_base": dict,
}
_REQUIRED_FIELDS = ("version", "embedder_id", "dim", "count", "files")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_IDENTITY = re.compile(r"[0-9a-f]{16}")


def _check_graph_base(base: dict[str, Any], count: int) -> None:
    if not base:
        return
    identity, rows = base.get("identity"), base.get("rows")
    if set(base) != {"identity", "rows"} or not isinstance(identity, str) or not _IDENTITY.fullmatch(identity):
        raise ValueError('field \'graph_base\' must be {"identity": 16 hex digits, "rows": a count}')
    if not isinstance(rows, int) or isinstance(rows, bool) or not 0 < rows <= count:
        raise ValueError(f"field 'graph_base' has rows {rows!r}, not between 1 and the count {count}")


def check_file_name(name: str) -> None:
    """A listed file must be a plain relative path inside its version folder (ValueError if not)."""
    parts = PurePosixPath(name).parts
    if (
        not name
        or "\\" in name
        or "\x00" in name
        or PurePosixPath(name).is_absolute()
        or any(part in ("..", ".") for part in parts)
        or name != "/".join(parts)
    ):
        raise ValueError(f"file name {name!r} is not a plain path inside the version folder")


def version_dir_name(version: int) -> str:
    return f"v{version:06d}"


def resolve_current(root: Path) -> Path:
    """The published version folder of an index root (or `root` itself if it is a version folder)."""
    if (root / MANIFEST).is_file():
        return root
    link = root / CURRENT
    if not link.exists():
        raise IndexLoadError(f"no published index at {root} (missing {CURRENT}); run the indexer first")
    folder = link.resolve()
    if folder.parent != root.resolve():
        raise IndexLoadError(f"{link} points outside {root}: only its own version folders are served")
    return folder


def manifest_identity(raw: bytes) -> str:
    """What a version holds, not what it is numbered: the manifest lists every file's sha256, so
    two versions share this only if they hold the same files (16 hex digits: 64 bits)."""
    return hashlib.sha256(raw).hexdigest()[:16]


def read_manifest_bytes(folder: Path) -> bytes:
    try:
        return (folder / MANIFEST).read_bytes()
    except FileNotFoundError as exc:
        raise IndexLoadError(f"index at {folder} has no {MANIFEST}") from exc
    except OSError as exc:
        raise IndexLoadError(f"index manifest at {folder} cannot be read: {exc}") from exc


def read_verified_version(folder: Path, yield_cpu: bool = False) -> tuple[Manifest, str]:
    """The manifest and its identity, once every listed file is inside `folder` and matches its
    checksum. Parsed and hashed from the same bytes, so the identity is of what was verified.
    `yield_cpu`: hash at a lower CPU priority (a hot reload, beside requests)."""
    raw = read_manifest_bytes(folder)
    try:
        manifest = Manifest.from_json(raw)
    except (ValueError, TypeError, RecursionError) as exc:
        raise IndexLoadError(f"index manifest at {folder} is corrupt: {exc}") from exc
    base = folder.resolve()
    for name in manifest.files:
        path = folder / name
        # A symlink could still lead out of the folder: the real path must stay inside.
        if not path.resolve().is_relative_to(base):
            raise IndexLoadError(f"index file {path} lies outside its version folder")
        if not path.is_file():
            raise IndexLoadError(f"index file {path} is missing")
    paths = [folder / name for name in manifest.files]
    # A million chunks are some 4.5 GB to hash: seconds of a core that requests beside a reload need more.
    try:
        actual = sha256_files(paths, nice=BACKGROUND_NICE if yield_cpu else 0)
    except OSError as exc:
        raise IndexLoadError(f"index at {folder}: its files could not be read ({exc})") from exc
    for path, digest, expected in zip(paths, actual, manifest.files.values(), strict=True):
        if digest != expected:
            raise IndexLoadError(f"index file {path} fails its checksum (corrupt or truncated)")
    return manifest, manifest_identity(raw)


def read_verified_manifest(folder: Path) -> Manifest:
    """Read the manifest and check every listed file against its checksum."""
    return read_verified_version(folder)[0]


def require_listed(folder: Path, manifest: Manifest, *names: str) -> None:
    """Only files the manifest lists (and so verified) are ever loaded."""
    for name in names:
        if name not in manifest.files:
            raise IndexLoadError(f"index at {folder}: {name} is not listed in its {MANIFEST}")


def require_all_listed(folder: Path, manifest: Manifest, directory: str, *required: str) -> None:
    """For a folder a library reads whole (a tokenizer, say): it exists, every file in it is listed
    (and so verified), and each of `required` (names inside it) is there."""
    root = folder / directory
    if not root.is_dir():
        raise IndexLoadError(f"index at {folder}: {directory}/ is missing")
    present = sorted(p.relative_to(folder).as_posix() for p in root.rglob("*") if not p.is_dir())
    unlisted = [name for name in present if name not in manifest.files]
    if unlisted:
        raise IndexLoadError(f"index at {folder}: {unlisted[0]} is not listed in its {MANIFEST}")
    for name in required:
        if not (root / name).is_file():
            raise IndexLoadError(f"index at {folder}: {directory}/{name} is missing")


def latest_version(root: Path) -> int:
    try:
        return read_verified_manifest(resolve_current(root)).version
    except IndexLoadError:
        versions = [int(p.name[1:]) for p in root.glob("v[0-9]*") if p.name[1:].isdigit()]
        return max(versions, default=0)


def _fsync_tree(folder: Path) -> None:
    for path in folder.iterdir():
        if path.is_dir():
            _fsync_tree(path)
        elif path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def new_build_dir(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    # Leftovers of killed builds are never published; clear them.
    for stale in root.glob(".build-*"):
        shutil.rmtree(stale, ignore_errors=True)
    build = root / f".build-{os.getpid()}"
    build.mkdir()
    return build


def publish(root: Path, build: Path, manifest: Manifest, keep: int = 2) -> Path:
    """Write the manifest, fsync, move the build into place and flip CURRENT atomically."""
    (build / MANIFEST).write_text(manifest.to_json())
    _fsync_tree(build)
    final = root / version_dir_name(manifest.version)
    if final.exists():
        shutil.rmtree(final)
    build.rename(final)
    tmp_link = root / f".{CURRENT}.tmp"
    if tmp_link.is_symlink() or tmp_link.exists():
        tmp_link.unlink()
    tmp_link.symlink_to(final.name)
    os.replace(tmp_link, root / CURRENT)
    _fsync_dir(root)
    _prune(root, keep=keep, current=final)
    return final


def _prune(root: Path, keep: int, current: Path) -> None:
    versions = sorted(p for p in root.glob("v[0-9]*") if p.is_dir())
    for old in versions[:-keep]:
        if old != current:
            shutil.rmtree(old, ignore_errors=True)
