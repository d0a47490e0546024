"""Bounds checks of an hnswlib index file, before hnswlib reads it.

hnswlib trusts its file: a neighbour id, entry point or level out of range is a read out of bounds
at the first search (a segfault, and a crash loop on restart). The checksum cannot catch a crafted
file, since whoever wrote the file can write the manifest that vouches for it. So the graph is
checked here, with numpy over the level-0 block read a slab at a time (a 100k-vector, 384-dim
index takes about 0.1 s; its checksum about 0.4 s).

The layout, as hnswlib's saveIndex writes it (hnswlib 0.8; little-endian):

    header   offset_level0, max_elements, count, bytes_per_element, label_offset, vector_offset (u64),
             max_level (i32), entry_point (u32), max_m, max_m0, m (u64), mult (f64), ef_construction (u64)
    level 0  `count` records of bytes_per_element: a u32 link count (hnswlib's deleted mark lives in
             its third byte), max_m0 neighbour ids (u32), the vector (dim float32), the label (u64)
    upper    per element, a u32 byte size, then one link list per level above 0: a u32 count and
             max_m ids (u32)
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ragserve.errors import IndexLoadError

_HEADER = struct.Struct("<QQQQQQiIQQQdQ")
_U32 = 4
_LABEL_BYTES = 8
# hnswlib keeps a list's length in 16 bits.
_MAX_LINKS = 0xFFFF
# Level-0 records checked at a time: about 100 MB of a 384-dim graph's file.
_SLAB_ELEMENTS = 65_536


def check_hnsw_file(path: Path, count: int, dim: int) -> None:
    """Raise IndexLoadError unless every id, level and size in the file is in range for an index
    of `count` vectors of `dim` floats (the manifest's), so hnswlib can only read inside its memory."""
    size = path.stat().st_size
    if size < _HEADER.size:
        raise _invalid(path, f"{size} bytes, shorter than its header")
    with path.open("rb") as handle:
        header = _Header(*_HEADER.unpack(handle.read(_HEADER.size)))
        _check_header(path, header, count, dim)
        level0_end = _HEADER.size + count * header.per_element
        if size < level0_end:
            raise _invalid(path, f"{size} bytes, too short for {count} elements")
        if count == 0:
            if size != level0_end:
                raise _invalid(path, "bytes after an empty graph")
            return
        # Read a slab of records at a time, not mapped: a reload runs beside the serving version,
        # and a mapped file's pages would count in its memory until the check ends (1.7 GB at 1M).
        labels = np.empty(count, dtype=np.uint64)
        for first in range(0, count, _SLAB_ELEMENTS):
            rows = min(_SLAB_ELEMENTS, count - first)
            slab = np.fromfile(handle, dtype=np.uint8, count=rows * header.per_element)
            labels[first : first + rows] = _check_level0(path, header, slab.reshape(rows, header.per_element), count)
        if not np.array_equal(np.sort(labels), np.arange(count, dtype=np.uint64)):
            raise _invalid(path, "labels are not 0..count-1, one each")
        tail = np.fromfile(handle, dtype=np.uint8)
    levels, rows_of_links = _upper_levels(path, tail, count, header.max_m)
    entry = header.entry_point
    if not (0 <= entry < count) or header.max_level != int(levels.max()) or levels[entry] != header.max_level:
        raise _invalid(path, f"entry point {entry} at level {header.max_level} is not the top element")
    if rows_of_links.size:
        _check_upper_links(path, rows_of_links, levels, header.max_m, count)


class _Header(NamedTuple):
    """The header fields, in file order."""

    offset_level0: int
    max_elements: int
    file_count: int
    per_element: int
    label_offset: int
    vector_offset: int
    max_level: int
    entry_point: int
    max_m: int
    max_m0: int
    m: int
    mult: float
    ef_construction: int

    @property
    def links0_bytes(self) -> int:
        return _U32 * (1 + self.max_m0)


def _check_header(path: Path, header: _Header, count: int, dim: int) -> None:
    """Sizes and offsets must match the manifest's count and dimension."""
    if header.file_count != count:
        raise _invalid(path, f"holds {header.file_count} vectors, manifest says {count}")
    max_m, max_m0 = header.max_m, header.max_m0
    if header.offset_level0 != 0 or not (1 <= max_m <= _MAX_LINKS and 1 <= max_m0 <= _MAX_LINKS):
        raise _invalid(path, f"header out of range (offset {header.offset_level0}, maxM {max_m}, maxM0 {max_m0})")
    links0 = header.links0_bytes
    expected = (links0, links0 + _U32 * dim, links0 + _U32 * dim + _LABEL_BYTES)
    if (header.vector_offset, header.label_offset, header.per_element) != expected:
        raise _invalid(path, f"element layout does not match {dim}-dimensional vectors and maxM0 {max_m0}")


def _check_level0(path: Path, header: _Header, level0: np.ndarray, count: int) -> np.ndarray:
    """Level-0 link counts and neighbour ids, over records as rows of bytes; returns their labels."""
    link_counts = level0[:, :_U32].copy().view("<u4").ravel()
    if int(link_counts.max()) > header.max_m0:
        raise _invalid(path, f"a level-0 neighbour list is longer than maxM0 ({header.max_m0}) or marked deleted")
    neighbours = level0[:, _U32 : header.links0_bytes].copy().view("<u4")
    used = np.arange(header.max_m0) < link_counts[:, None]
    if bool((neighbours[used] >= count).any()):
        raise _invalid(path, f"a level-0 neighbour id is out of range (>= {count})")
    return level0[:, header.label_offset : header.per_element].copy().view("<u8").ravel()


def _check_upper_links(path: Path, rows: np.ndarray, levels: np.ndarray, max_m: int, count: int) -> None:
    """Upper-level lists (rows of level, count, max_m ids): lengths, ids, and the neighbours' levels."""
    row_levels = rows[:, 0].astype(np.int64)
    upper_counts = rows[:, 1]
    if int(upper_counts.max()) > max_m:
        raise _invalid(path, f"an upper-level neighbour list is longer than maxM ({max_m})")
    ids = rows[:, 2:]
    used = np.arange(max_m) < upper_counts[:, None]
    if bool((ids[used] >= count).any()):
        raise _invalid(path, f"an upper-level neighbour id is out of range (>= {count})")
    # hnswlib walks a neighbour's list at the same level: it must have that level.
    neighbour_levels = levels[np.where(used, ids, 0)]
    if bool((used & (neighbour_levels < row_levels[:, None])).any()):
        raise _invalid(path, "an upper-level neighbour does not reach that level")


def _invalid(path: Path, reason: str) -> IndexLoadError:
    return IndexLoadError(f"index file {path} is not a valid HNSW graph: {reason}")


def _upper_levels(path: Path, tail: np.ndarray, count: int, max_m: int) -> tuple[np.ndarray, np.ndarray]:
    """Each element's level, and its upper link lists as rows of (level, count, max_m ids)."""

    def bad(reason: str) -> IndexLoadError:
        return _invalid(path, reason)

    if tail.size % _U32:
        raise bad("the link lists are not whole 32-bit words")
    words = tail.view("<u4")
    list_words = 1 + max_m
    list_bytes = _U32 * list_words
    levels = np.zeros(count, dtype=np.int64)
    # Sequential by nature (each size says where the next one is); a plain list walks fastest.
    sizes = words.tolist()
    starts: list[int] = []
    pos = 0
    total = len(sizes)
    for element in range(count):
        if pos >= total:
            raise bad(f"link lists end after {element} of {count} elements")
        size = sizes[pos]
        if size:
            if size % list_bytes:
                raise bad(f"element {element}'s link lists are {size} bytes, not a multiple of {list_bytes}")
            levels[element] = size // list_bytes
            starts.append(pos + 1)
            pos += 1 + size // _U32
        else:
            pos += 1
    if pos != total:
        raise bad("bytes after the last element's link lists" if pos < total else "the last link list is cut short")
    upper = np.flatnonzero(levels)
    if not upper.size:
        return levels, np.zeros((0, 2 + max_m), dtype=np.int64)
    per_element = levels[upper]
    # One row per (element, level): where its list starts in `words`, and which level it is.
    first = np.repeat(np.asarray(starts, dtype=np.int64), per_element)
    within = np.arange(per_element.sum()) - np.repeat(np.cumsum(per_element) - per_element, per_element)
    row_start = first + within * list_words
    lists = words[row_start[:, None] + np.arange(list_words)].astype(np.int64)
    return levels, np.column_stack([within + 1, lists])
