"""A version's `vectors.npy`, written and read a slab at a time with plain file I/O, never mapped:
a build walks a million rows (1.5 GB) without their pages counting in its memory, where a mapped
matrix's pages stay in the process's RSS once read (docs/indexing.md, memory)."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

_DTYPE = np.dtype("<f4")
SLAB_ROWS = 32_768  # 48 MiB of 384-wide rows


def _header(count: int, dim: int) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(  # type: ignore[no-untyped-call]
        buffer, {"descr": _DTYPE.str, "fortran_order": False, "shape": (count, dim)}
    )
    return buffer.getvalue()


class VectorWriter:
    """Appends float32 rows to a `.npy` file whose header is written last. numpy pads a header so
    that its first axis can grow in place: the one written at the start has the final length."""

    def __init__(self, path: Path, dim: int) -> None:
        self.path = path
        self.dim = dim
        self.count = 0
        self._handle = path.open("wb")
        self._handle.write(_header(0, dim))

    def append(self, rows: np.ndarray) -> None:
        if rows.ndim != 2 or rows.shape[1] != self.dim:
            raise ValueError(f"rows of shape {rows.shape}, expected (n, {self.dim})")
        self._handle.write(np.ascontiguousarray(rows, dtype=_DTYPE).tobytes())
        self.count += len(rows)

    def close(self) -> None:
        header = _header(self.count, self.dim)
        if len(header) != len(_header(0, self.dim)):
            raise ValueError(f"{self.count} rows do not fit the reserved .npy header")
        self._handle.seek(0)
        self._handle.write(header)
        self._handle.close()


class VectorFile:
    """Rows of a `.npy` float32 matrix, read on demand: `len`, a slice, or an array of row numbers
    (what `hnsw_build.measure_ef` and `exact_top` ask of a matrix) each cost only the rows asked for."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with path.open("rb") as handle:
            version = np.lib.format.read_magic(handle)  # type: ignore[no-untyped-call]
            fmt = np.lib.format
            read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, fortran, dtype = read_header(handle)  # type: ignore[no-untyped-call]
            self._offset = handle.tell()
        if fortran or dtype != _DTYPE or len(shape) != 2:
            raise ValueError(f"{path}: not a C-ordered float32 matrix ({dtype}, {shape})")
        self.count, self.dim = int(shape[0]), int(shape[1])
        self.shape = (self.count, self.dim)
        self._fd = os.open(path, os.O_RDONLY)

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> VectorFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return self.count

    def read(self, start: int, stop: int) -> np.ndarray:
        start, stop = max(0, start), min(stop, self.count)
        if stop <= start:
            return np.zeros((0, self.dim), dtype=np.float32)
        width = self.dim * _DTYPE.itemsize
        data = os.pread(self._fd, (stop - start) * width, self._offset + start * width)
        if len(data) != (stop - start) * width:
            raise ValueError(f"{self.path}: truncated at row {start}")
        return np.frombuffer(data, dtype=_DTYPE).reshape(stop - start, self.dim).astype(np.float32)

    def __getitem__(self, key: Any) -> np.ndarray:
        if isinstance(key, slice):
            start, stop, step = key.indices(self.count)
            if step != 1:
                raise ValueError("a VectorFile slice reads consecutive rows")
            return self.read(start, stop)
        rows = np.asarray(key, dtype=np.int64)
        out = np.empty((*rows.shape, self.dim), dtype=np.float32)
        for i, row in enumerate(rows.reshape(-1).tolist()):
            out.reshape(-1, self.dim)[i] = self.read(row, row + 1)[0]
        return out

    def slabs(self, start: int = 0, rows: int = SLAB_ROWS) -> Iterator[tuple[int, np.ndarray]]:
        """(first row, rows) from `start` to the end, `rows` at a time."""
        for first in range(start, self.count, rows):
            yield first, self.read(first, first + rows)
