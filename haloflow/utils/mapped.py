"""A ``.npy`` file memory-mapped read-only and read in slices, its pages handed back to the OS behind the reader.

::

    file     | header | row 0 | row 1 | ... | row R-1 |          (C order; a Fortran-order (E, 2) array is
                       '---- mapped, never read whole ----'        two columns one after the other)
    rows(lo, hi)  ->  a copy of array[lo:hi]  (touches only those pages)
                  ->  madvise(MADV_DONTNEED) on the mapping (the pages leave this process's RSS; the page cache
                      keeps them, so reading them again costs no disk read while memory lasts)

``np.load(mmap_mode="r")`` maps the file too, but every page read stays in the process's resident set until the
map is closed, so a pass over a 4 GB edge file shows a 4 GB peak RSS although the kernel could drop those pages
at any time. Releasing them behind the reader keeps the measured peak at what the pass really holds.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

from haloflow.errors import InputFormatError

__all__ = ["MappedNpy", "NpyWriter", "npy_header", "write_npy"]

_COPY_SLICE = 8 << 20  # bytes copied out of a map between two releases of its pages


def npy_header(path: str | os.PathLike) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """``(shape, fortran_order, dtype, data_offset)`` of a ``.npy`` file, read from its header alone.

    Raises:
        InputFormatError: not a ``.npy`` file, an object dtype, or a file shorter than its header says.
    """
    path = Path(path)
    with open(path, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(f)
        except (ValueError, SyntaxError, OSError) as err:
            raise InputFormatError(path, f"not a readable .npy file ({err}): expected an array saved by numpy.save")
        offset = f.tell()
    if dtype.hasobject:
        raise InputFormatError(path, f"holds Python objects (dtype {dtype}): expected a numeric array")
    need = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = path.stat().st_size
    if size < need:
        raise InputFormatError(path, f"is truncated: {size:,} bytes, but its header {shape} {dtype} needs {need:,}")
    return tuple(int(s) for s in shape), bool(fortran), dtype, offset


class MappedNpy:
    """A read-only map of one ``.npy`` file (layout in the module docstring).

    Attributes:
        array: the whole array as a view of the map (indexing it reads pages; call `release` after a pass).
        shape, dtype: from the header.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.shape, fortran, self.dtype, offset = npy_header(self.path)
        self._file = open(self.path, "rb")
        nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        if nbytes == 0:
            self._map = None
            self.array = np.zeros(self.shape, dtype=self.dtype, order="F" if fortran else "C")
        else:
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
            self.array = np.ndarray(self.shape, dtype=self.dtype, buffer=self._map, offset=offset,
                                    order="F" if fortran else "C")

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 0

    def rows(self, lo: int, hi: int) -> np.ndarray:
        """A copy of ``array[lo:hi]`` (along the first axis). It is copied a slice at a time, the pages released
        after each, so the copy is all that stays resident (not the copy and the pages it was read from)."""
        src = self.array[lo:hi]
        out = np.empty(src.shape, dtype=self.dtype)
        step = max(_COPY_SLICE // max(src[:1].nbytes, 1), 1)
        for a in range(0, src.shape[0], step):
            out[a:a + step] = src[a:a + step]
            self.release()
        return out

    def columns(self, lo: int, hi: int) -> np.ndarray:
        """A copy of ``array[:, lo:hi]`` (a (2, E) edge array read in column ranges), released as `rows` is."""
        src = self.array[:, lo:hi]
        out = np.empty(src.shape, dtype=self.dtype)
        step = max(_COPY_SLICE // max(src[:, :1].nbytes, 1), 1)
        for a in range(0, src.shape[1], step):
            out[:, a:a + step] = src[:, a:a + step]
            self.release()
        return out

    def release(self) -> None:
        """Hand the pages read so far back to the OS (they leave the resident set; the file is not changed)."""
        if self._map is not None and hasattr(self._map, "madvise"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        self.array = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view handed out still points into the map: it closes when that view goes
                pass
        self._file.close()

    def __enter__(self) -> "MappedNpy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_HEADER_BYTES = 128  # every header NpyWriter writes takes this many bytes, so it can be rewritten in place


def _header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """A version 1.0 ``.npy`` header of exactly ``_HEADER_BYTES`` bytes (the dict padded with spaces, as numpy
    pads its own headers to 64-byte alignment)."""
    body = repr({"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape})
    room = _HEADER_BYTES - 10 - 1  # magic (6) + version (2) + length (2); the dict ends with a newline
    if len(body) > room:
        raise ValueError(f"npy header for shape {shape} is longer than {room} bytes")
    text = body.ljust(room) + "\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode("latin1")


class NpyWriter:
    """Write a ``.npy`` file piece by piece along its first axis (header first, then the rows as they come), so
    an array larger than memory never exists whole. With ``shape[0]`` None the length is what was written (the
    header is rewritten at `close`); otherwise `close` checks that every row came.

    Example::

        with NpyWriter(path, np.int64, (num_edges, 2)) as w:
            for chunk in chunks:        # (e, 2) each
                w.write(chunk)
    """

    def __init__(self, path: str | os.PathLike, dtype, shape: tuple[int | None, ...]):
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        self.shape = tuple(None if s is None else int(s) for s in shape)
        self._file = open(self.path, "wb")
        self._file.write(_header(self.dtype, (2**62,) + self.shape[1:] if self.shape[0] is None else self.shape))
        self.rows_written = 0

    def write(self, rows: np.ndarray) -> None:
        rows = np.ascontiguousarray(rows, dtype=self.dtype)
        if rows.ndim == 0 or rows.shape[1:] != self.shape[1:]:
            raise ValueError(f"{self.path}: rows of shape {rows.shape[1:]} for an array of shape {self.shape}")
        n = rows.shape[0]
        if self.shape[0] is not None and self.rows_written + n > self.shape[0]:
            raise ValueError(f"{self.path}: {self.rows_written + n:,} rows written, the array has {self.shape[0]:,}")
        self._file.write(rows.data)  # through the file's buffer: many small writes stay cheap
        self.rows_written += n

    def close(self) -> Path:
        if self.shape[0] is None:
            self._file.seek(0)
            self._file.write(_header(self.dtype, (self.rows_written,) + self.shape[1:]))
            self.shape = (self.rows_written,) + self.shape[1:]
        self._file.close()
        if self.rows_written != self.shape[0]:
            self.path.unlink(missing_ok=True)  # an incomplete array is no array
            raise ValueError(f"{self.path}: {self.rows_written:,} of {self.shape[0]:,} rows written")
        return self.path

    def abort(self) -> None:
        self._file.close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> "NpyWriter":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


_WRITE_SLICE = 8 << 20  # bytes copied per write() by write_npy (and at most resident of a mapped source)


def _mapping_of(arr: np.ndarray):
    """The ``mmap.mmap`` an array's memory belongs to (following ``.base``), or None."""
    base = arr
    while base is not None:
        if isinstance(base, mmap.mmap):
            return base
        if isinstance(base, memoryview):
            base = base.obj
            continue
        base = getattr(base, "base", None)
        if isinstance(base, np.memmap) and getattr(base, "_mmap", None) is not None:
            return base._mmap
    return None


def write_npy(path: str | os.PathLike, arr: np.ndarray) -> None:
    """``np.save(path, arr)`` (the same bytes) writing ``_WRITE_SLICE`` bytes at a time; when ``arr`` lives in a
    read-only file map (`MappedNpy`, ``np.load(mmap_mode="r")``), the pages already written are released as it
    goes, so copying a mapped array larger than memory keeps a slice of it resident, not the whole.
    """
    arr = np.ascontiguousarray(arr)
    mapping = _mapping_of(arr)
    flat = arr.reshape(-1)
    step = max(_WRITE_SLICE // max(arr.dtype.itemsize, 1), 1)
    with open(path, "wb") as f:
        header = np.lib.format.header_data_from_array_1_0(arr)
        try:
            np.lib.format.write_array_header_1_0(f, header)
        except ValueError:  # a header over 64 KiB (a huge structured dtype): what np.save falls back to
            f.seek(0)
            f.truncate()
            np.lib.format.write_array_header_2_0(f, header)
        for lo in range(0, flat.shape[0], step):
            f.write(flat[lo:lo + step].data)
            if mapping is not None and hasattr(mapping, "madvise") and not mapping.closed:
                mapping.madvise(mmap.MADV_DONTNEED)
