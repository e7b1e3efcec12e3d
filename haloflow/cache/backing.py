"""``BackingStore``: every row of a table and its optimizer state, in host memory or in memory-mapped files.

A memory-mapped table is a folder, created all at once (`haloflow.utils.atomic.atomic_directory`)::

    table/
      meta.json        {"format": "haloflow-table", "version": 1, "name": ..., "num_rows": N, "dim": D,
                        "dtype": "float32", "optimizer": {"name": "adagrad", "lr": ...},
                        "arrays": {"weight": [N, D], "sum": [N, D]}}
      weight.bin       N x D float32, row-major (np.memmap)
      sum.bin          optimizer state, one file per state array (none for SGD)

Only the pages of rows that are read or written are brought into memory, so a table larger than RAM works. The
pages stay cached by the OS after use; ``max_resident_bytes`` bounds how many of them this process keeps mapped
(its RSS): past it, the mapping is dropped with ``madvise(MADV_DONTNEED)`` (dirty pages stay in the page cache
and reach the file as usual; the next access maps them again). The cap bounds what stays mapped between calls,
not the peak inside one call: on kernels that keep file pages in large folios (6.18 here), one fault maps the
whole folio, so touching a byte every 256 KiB of a 128 MiB file mapped all of it (measured), and one scattered
read of ~1,000 rows briefly maps most of a 122 MiB table. Reading rows with ``pread`` instead would avoid that
(not done yet).

Host-memory tables are pinned when CUDA is available, so row copies to the device can be asynchronous.

Shapes:
    read: ids int64 (n,) -> {"weight": (n, D), state: (n, ...)} on the host; write: the same, in place
"""

from __future__ import annotations

import json
import math
import mmap
import os
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from haloflow.cache.kernels import exchange_rows, read_through
from haloflow.cache.memory import check_state_dict
from haloflow.cache.optim import make_optimizer
from haloflow.cache.types import RowOptimizer
from haloflow.errors import ConfigError, InputFormatError
from haloflow.utils.atomic import atomic_directory, atomic_write_text

__all__ = ["BackingStore", "uniform_rows", "TABLE_FORMAT"]

TABLE_FORMAT = "haloflow-table"
_VERSION = 1
_BLOCK = 1 << 16  # rows per initialisation block: the values of a row do not depend on how a table is built
_PAGE = mmap.PAGESIZE


def uniform_rows(num_rows: int, dim: int, *, seed: int = 0, start: int = 0, stop: int | None = None,
                 bound: float | None = None) -> Tensor:
    """Rows ``start..stop-1`` of a table drawn from U(-bound, bound) (default bound 1/sqrt(N), DLRM's init).

    Row ``i`` is the same whichever range it is drawn in: each block of 65,536 rows has its own generator seeded
    by (seed, block), so a table larger than RAM can be initialised block by block.
    """
    stop = num_rows if stop is None else stop
    bound = 1.0 / math.sqrt(num_rows) if bound is None else bound
    out = torch.empty(stop - start, dim)  # (stop - start, D)
    first, last = start // _BLOCK, (stop - 1) // _BLOCK if stop > start else start // _BLOCK - 1
    for b in range(first, last + 1):
        lo, hi = b * _BLOCK, min((b + 1) * _BLOCK, num_rows)
        gen = torch.Generator().manual_seed(seed * 1_000_003 + b)
        block = torch.empty(hi - lo, dim).uniform_(-bound, bound, generator=gen)  # (<= 65536, D)
        a, z = max(lo, start), min(hi, stop)
        out[a - start:z - start] = block[a - lo:z - lo]
    return out


def _array_shapes(num_rows: int, dim: int, optimizer: RowOptimizer) -> dict[str, tuple[tuple[int, ...], float]]:
    shapes = {"weight": ((dim,), 0.0)}
    shapes.update(optimizer.state_spec(dim))
    return {k: ((num_rows, *s), v) for k, (s, v) in shapes.items()}


def _is_table_folder(folder: Path) -> bool:
    """A folder ``create`` wrote (its meta.json says ``haloflow-table``): what ``overwrite`` may replace."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == TABLE_FORMAT


class BackingStore:
    """The home of every row. Build with ``in_memory``, ``create`` (a new memory-mapped folder) or ``open``.

    Attributes:
        arrays: ``{"weight": (N, D), state name: (N, ...)}`` host tensors (views of the maps when file-backed).
        path: the folder of a memory-mapped table, None in host memory.
    """

    def __init__(self, arrays: dict[str, Tensor], optimizer: RowOptimizer, *, name: str, path: Path | None = None,
                 maps: list[mmap.mmap] = (), max_resident_bytes: int | None = None):
        self.arrays, self.optimizer, self.name, self.path = arrays, optimizer, name, path
        self.num_rows, self.dim = (int(s) for s in arrays["weight"].shape)
        self.row_bytes = sum(a[0].numel() * a.element_size() for a in arrays.values())
        self.pinned = arrays["weight"].is_pinned()
        self._maps = list(maps)
        self._max_resident = max_resident_bytes
        self._touched = 0  # bytes of pages mapped since the last release (an upper estimate)
        self._flat = {k: a.numpy().reshape(self.num_rows, -1) for k, a in arrays.items()}  # (N, w) views

    # ------------------------------------------------------------------------------------------ building
    @classmethod
    def in_memory(cls, num_rows: int, dim: int, optimizer: RowOptimizer, *, weight: Tensor | None = None,
                  seed: int = 0, pin: bool | None = None, name: str = "table", copy: bool = True) -> BackingStore:
        """A table in host memory: ``weight`` (N, D) copied in, or ``uniform_rows(N, D, seed=seed)``.

        ``pin`` None pins when CUDA is available. ``copy=False`` keeps ``weight`` itself as the table when it can
        (a contiguous float32 host tensor, not to be pinned), so that building a large table does not hold it twice;
        the caller must then not use ``weight`` elsewhere.
        """
        _check_size(name, num_rows, dim, weight)
        pin = torch.cuda.is_available() if pin is None else pin
        keep = (not copy and not pin and weight is not None and weight.device.type == "cpu"
                and weight.dtype == torch.float32 and weight.is_contiguous())
        arrays = {}
        for k, (shape, init) in _array_shapes(num_rows, dim, optimizer).items():
            if k == "weight" and keep:
                arrays[k] = weight.detach()
            else:
                arrays[k] = torch.full(shape, init, dtype=torch.float32, pin_memory=pin)
        if not keep:
            arrays["weight"].copy_(weight if weight is not None else uniform_rows(num_rows, dim, seed=seed))
        return cls(arrays, optimizer, name=name)

    @classmethod
    def create(cls, path: str | os.PathLike, num_rows: int, dim: int, optimizer: RowOptimizer, *,
               weight: Tensor | None = None, seed: int = 0, name: str | None = None, overwrite: bool = False,
               max_resident_bytes: int | None = 256 << 20) -> BackingStore:
        """Write a new memory-mapped table folder at ``path`` (atomically) and open it.

        The files are written block by block with ordinary writes, never through a mapping, so creating a table
        larger than RAM keeps this process's memory at one block.

        Raises:
            OutputExistsError: ``path`` exists and ``overwrite`` is False.
            ConfigError: ``path`` is a folder, but not a table folder (never replaced).
        """
        path = Path(path)
        name = path.name if name is None else name
        _check_size(name, num_rows, dim, weight)
        shapes = _array_shapes(num_rows, dim, optimizer)
        with atomic_directory(path, overwrite=overwrite, ours=_is_table_folder, what="table folder") as tmp:
            for k, (shape, init) in shapes.items():
                with open(tmp / f"{k}.bin", "wb") as f:
                    for lo in range(0, num_rows, _BLOCK):
                        hi = min(lo + _BLOCK, num_rows)
                        if k != "weight":
                            rows = torch.full((hi - lo, *shape[1:]), init)
                        elif weight is not None:
                            rows = weight[lo:hi].detach().to("cpu", torch.float32)
                        else:
                            rows = uniform_rows(num_rows, dim, seed=seed, start=lo, stop=hi)
                        f.write(rows.contiguous().numpy().tobytes())
            meta = {"format": TABLE_FORMAT, "version": _VERSION, "name": name, "num_rows": num_rows, "dim": dim,
                    "dtype": "float32", "optimizer": optimizer.config(),
                    "arrays": {k: list(s) for k, (s, _) in shapes.items()}}
            atomic_write_text(tmp / "meta.json", json.dumps(meta, indent=1) + "\n")
        return cls.open(path, optimizer, max_resident_bytes=max_resident_bytes)

    @classmethod
    def open(cls, path: str | os.PathLike, optimizer: RowOptimizer | None = None, *,
             max_resident_bytes: int | None = 256 << 20) -> BackingStore:
        """Map an existing table folder. ``optimizer`` None uses the one recorded in ``meta.json``; a given one
        may change hyperparameters (a new lr) but must keep the same state arrays.

        Raises:
            FileNotFoundError: no ``meta.json`` in ``path``.
            InputFormatError: ``meta.json`` is not a table's, or a file is missing or of the wrong size.
            ConfigError: ``optimizer`` needs other state arrays than the table holds.
        """
        path = Path(path)
        meta_path = path / "meta.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{path}: no meta.json; expected a table folder made by BackingStore.create")
        try:
            meta = json.loads(meta_path.read_text())
            if meta.get("format") != TABLE_FORMAT or meta.get("version") != _VERSION:
                raise ValueError(f"format {meta.get('format')!r} version {meta.get('version')!r}")
            num_rows, dim, name = int(meta["num_rows"]), int(meta["dim"]), str(meta["name"])
            stored = {k: tuple(int(x) for x in v) for k, v in meta["arrays"].items()}
            recorded = make_optimizer(meta["optimizer"])
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise InputFormatError(meta_path, f"not a {TABLE_FORMAT} version {_VERSION} header ({err})") from None
        optimizer = recorded if optimizer is None else optimizer
        wanted = {k: s for k, (s, _) in _array_shapes(num_rows, dim, optimizer).items()}
        if wanted != stored:
            raise ConfigError(f"table {name!r} at {path} holds arrays {stored} for optimizer "
                              f"{recorded.name!r}; optimizer {optimizer.name!r} needs {wanted}", field="optimizer")
        arrays, maps = {}, []
        for k, shape in stored.items():
            file = path / f"{k}.bin"
            size = 4 * math.prod(shape)
            if not file.is_file() or file.stat().st_size != size:
                found = file.stat().st_size if file.is_file() else "missing"
                raise InputFormatError(file, f"expected {size} bytes for {k} {shape} float32, found {found}")
            with open(file, "r+b") as f:
                mm = mmap.mmap(f.fileno(), size) if size else None
            maps += [mm] if mm is not None else []
            buf = np.frombuffer(mm, dtype=np.float32) if mm is not None else np.empty(0, np.float32)
            arrays[k] = torch.from_numpy(buf.reshape(shape))  # a view of the file, no copy
        return cls(arrays, optimizer, name=name, path=path, maps=maps, max_resident_bytes=max_resident_bytes)

    # ------------------------------------------------------------------------------------------ rows
    def read(self, ids: Tensor, keys: tuple[str, ...] | None = None) -> dict[str, Tensor]:
        """Copies of rows ``ids`` (n,) of every array (or of ``keys``), on the host (pinned when the table is)."""
        ids = ids.to("cpu")
        out = {}
        for k, a in self.arrays.items():
            if keys is not None and k not in keys:
                continue
            buf = torch.empty((ids.numel(), *a.shape[1:]), dtype=a.dtype, pin_memory=self.pinned)
            out[k] = torch.index_select(a, 0, ids, out=buf)  # (n, ...)
        self._touch(ids.numel())
        return out

    def write(self, ids: Tensor, rows: dict[str, Tensor]) -> None:
        """Store ``rows`` (n, ...) of every array at ``ids`` (n,), distinct."""
        ids = ids.to("cpu")
        for k, a in self.arrays.items():
            a.index_copy_(0, ids, rows[k].to("cpu"))
        self._touch(ids.numel())

    def exchange(self, slots: dict[str, np.ndarray], write_slots: np.ndarray, write_ids: np.ndarray,
                 read_ids: np.ndarray, read_slots: np.ndarray) -> None:
        """A cache's moves on host slots, one compiled pass per array: rows ``write_ids`` <- ``slots[k]
        [write_slots]``, then ``slots[k][read_slots]`` <- rows ``read_ids``. ``slots``: {array name: (S, w)
        NumPy view of the slots in host memory} (``host_views``)."""
        for k, table in self._flat.items():
            exchange_rows(slots[k], table, write_slots, write_ids, read_ids, read_slots)
        self._touch(write_ids.size + read_ids.size)

    def read_through(self, slots: dict[str, np.ndarray], slot: np.ndarray, ids: np.ndarray,
                     keys: tuple[str, ...] | None = None) -> dict[str, Tensor]:
        """Copies of rows ``ids`` (u,) of every array (or of ``keys``), each from ``slots[k][slot[j]]`` where
        ``slot[j] >= 0`` and from this store otherwise, one compiled pass per array (``slots`` as for
        ``exchange``)."""
        out = {}
        for k, table in self._flat.items():
            if keys is not None and k not in keys:
                continue
            out[k] = torch.empty((ids.size, *self.arrays[k].shape[1:]), dtype=self.arrays[k].dtype)  # (u, ...)
            read_through(slots[k], table, slot, ids, out[k].numpy().reshape(ids.size, -1))
        if self._maps:
            self._touch(int(np.count_nonzero(slot < 0)))
        return out

    def host_arrays(self, keys: list[str]) -> tuple[np.ndarray, ...]:
        """(N, w) NumPy views of the arrays ``keys``, in that order, for the compiled row copies
        (``kernels.serve_batch``); pair each use with ``touch``."""
        return tuple(self._flat[k] for k in keys)

    def touch(self, n: int) -> None:
        """``n`` rows were read or written through ``host_arrays`` (a memory-mapped table drops its mapped pages
        when they pass ``max_resident_bytes``)."""
        self._touch(n)

    @staticmethod
    def host_views(slots: dict[str, Tensor]) -> dict[str, np.ndarray] | None:
        """(S, w) NumPy views of a cache's slot arrays for ``exchange`` and the ``*_through`` copies; None when
        the slots are not in host memory (a GPU: then ``read`` and ``write``)."""
        if any(a.device.type != "cpu" for a in slots.values()):
            return None
        return {k: a.numpy().reshape(a.shape[0], -1) for k, a in slots.items()}

    @property
    def write_chunk(self) -> int:
        """Rows per ``write`` call that keep the mapped pages near ``max_resident_bytes`` (scattered rows map one
        page per array each), for callers that write many rows (a cache's flush)."""
        if self._max_resident is None or not self._maps:
            return _BLOCK
        return max(256, self._max_resident // (_PAGE * len(self.arrays)))

    def _touch(self, n: int) -> None:
        if self._max_resident is None or not self._maps:
            return
        # A row narrower than a page maps one page per array (an upper estimate: neighbours share pages).
        self._touched += n * sum(max(_PAGE, a[0].numel() * a.element_size()) for a in self.arrays.values())
        if self._touched > self._max_resident:
            self.release()

    def release(self) -> None:
        """Drop this process's mapping of the file pages (its RSS); the data stays in the page cache."""
        for mm in self._maps:
            mm.madvise(mmap.MADV_DONTNEED)
        self._touched = 0

    # ------------------------------------------------------------------------------------------ state
    def flush(self) -> None:
        """Push written rows to the files (``msync``); nothing to do in host memory."""
        for mm in self._maps:
            mm.flush()

    def state_dict(self) -> dict[str, Tensor]:
        """The arrays themselves (views of the files when mapped): complete, shared; clone to snapshot."""
        return dict(self.arrays)

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        check_state_dict(self.name, state, {k: tuple(a.shape) for k, a in self.arrays.items()})
        for k, a in self.arrays.items():
            for lo in range(0, self.num_rows, _BLOCK):
                a[lo:lo + _BLOCK].copy_(state[k][lo:lo + _BLOCK])
        self.flush()

    def close(self) -> None:
        """Flush and unmap. The store must not be used afterwards."""
        self.flush()
        self.arrays, self._flat = {}, {}
        for mm in self._maps:
            try:
                mm.close()
            except BufferError:  # someone still holds a view (a state_dict tensor); unmapped when it goes
                pass
        self._maps = []


def _check_size(name: str, num_rows: int, dim: int, weight: Tensor | None) -> None:
    if num_rows < 1 or dim < 1:
        raise ConfigError(f"table {name!r}: num_rows and dim must be >= 1, got {num_rows} x {dim}")
    if weight is not None and tuple(weight.shape) != (num_rows, dim):
        raise ConfigError(f"table {name!r}: weight of shape {tuple(weight.shape)}, expected ({num_rows}, {dim})")
