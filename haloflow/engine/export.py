"""A trained model as one file a single process loads: `export_model`, `load_model`, `ModelFile`.

A checkpoint (``engine/checkpoint.py``) holds a run in global terms, cut into the pieces its K ranks owned, with
the optimizer's state beside the weights. An export is the model alone, in the layout of the single-device model
(``haloflow/models/``: ``GCN``, ``DLRM``, ``TGN``), with the config that rebuilds it::

    MODEL.pt                               (torch's format; read with torch.load(weights_only=True): no code runs)
      {"format": "haloflow-model/1", "family": "dlrm", "step": 40, "world_size": 2,
       "config": {... the checkpoint's identity: model shape, data sizes ...},
       "tensors": {"bottom.0.weight": (512, 13), ..., "embeddings.tables.3.weight": (rows, 16), ...}}

    MODEL/                                 (tables larger than memory: a memory-mappable folder)
      model.json                           the same header; per tensor its file, shape and dtype
      tensor-0000.npy ...                  one NumPy array per tensor, written block by block of rows

Which tensors a family exports, and how they are read out of a checkpoint's pieces, is the family's
(``haloflow.engine.<family>.predict.export_tensors``). ``load_model`` reads either form, or a checkpoint itself
(exported in memory), so ``haloflow predict --model`` takes all three.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from haloflow.engine.checkpoint import LoadedCheckpoint, open_checkpoint
from haloflow.engine.families import FAMILIES
from haloflow.errors import CheckpointError, ConfigError
from haloflow.utils.atomic import atomic_directory, atomic_output
from haloflow.utils.config_flags import hidden, option
from haloflow.utils.memory import available_bytes, format_bytes

__all__ = ["ExportConfig", "ModelFile", "RowBlocks", "export_model", "load_model", "FORMAT", "LAYOUTS"]

FORMAT = "haloflow-model/1"
LAYOUTS = ("auto", "file", "folder")
_HEADER = "model.json"
_BLOCK_BYTES = 64 << 20  # a folder export reads and writes this much of a table at a time

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RowBlocks:
    """A tensor read block by block of rows, so that a table larger than memory is never whole in it."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    read: Callable[[int, int], torch.Tensor]  # rows lo..hi -> (hi - lo, *shape[1:])

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()

    def whole(self) -> torch.Tensor:
        return self.read(0, self.shape[0])


@dataclass(frozen=True, kw_only=True)
class ModelFile:
    """A model read back: its family, the config that rebuilds it, the step and K of the run that trained it, and
    its tensors by the single-device model's parameter names (memory-mapped from a folder export)."""

    family: str
    config: dict
    step: int
    world_size: int
    tensors: Mapping[str, torch.Tensor]
    source: Path

    def expect_family(self, family: str) -> None:
        if self.family != family:
            raise ConfigError(f"{self.source}: a {self.family.upper()} model, but this is `predict {family}`: "
                              f"expected a {family.upper()} model (or run `haloflow predict {self.family}`)",
                              field="model")

    def prefixed(self, prefix: str) -> dict[str, torch.Tensor]:
        """The tensors whose names begin with ``prefix``, the prefix taken off."""
        return {k[len(prefix):]: v for k, v in self.tensors.items() if k.startswith(prefix)}


@dataclass(frozen=True, kw_only=True)
class ExportConfig:
    """``haloflow export CHECKPOINT --out MODEL``.

    Args:
        checkpoint: a checkpoint folder, or a checkpoint dir (its newest checkpoint), written at any K.
        out: the model file (``layout="file"``) or folder (``"folder"``) to write.
        layout: "file" (one torch file), "folder" (one memory-mappable ``.npy`` per tensor) or "auto": a folder
            when the tensors would take more than half the memory available now.
        overwrite: replace an existing model of the same layout.
    """

    checkpoint: Path | None = hidden(None, why="the command's positional CHECKPOINT")
    out: Path = option(metavar="MODEL", help="the model file (or folder) to write")
    layout: str = option("auto", choices=LAYOUTS, means="a folder when the tables outgrow half the free memory",
                         help="one torch file, or a folder of memory-mappable .npy arrays")
    overwrite: bool = option(False, help="replace an existing model at --out")

    def __post_init__(self) -> None:
        if self.checkpoint is None:
            raise ConfigError("give the checkpoint to export", field="checkpoint")
        object.__setattr__(self, "checkpoint", Path(self.checkpoint))
        object.__setattr__(self, "out", Path(self.out))
        if self.layout not in LAYOUTS:
            raise ConfigError(f"layout must be one of {LAYOUTS}, got {self.layout!r}", field="layout")
        if not self.checkpoint.exists():
            raise FileNotFoundError(f"checkpoint {self.checkpoint} does not exist")
        if self.out.exists() and not self.overwrite:
            raise ConfigError(f"{self.out} already exists; pass --overwrite to replace it", field="out")


def _family_module(kind: str):
    if kind not in FAMILIES:
        raise CheckpointError(f"checkpoint of kind {kind!r}: no such model family (expected one of "
                              f"{', '.join(FAMILIES)})")
    return importlib.import_module(FAMILIES[kind].predict_module)


def _sources(loaded: LoadedCheckpoint) -> tuple[str, dict, dict[str, torch.Tensor | RowBlocks]]:
    kind = loaded.manifest["kind"]
    config, tensors = _family_module(kind).export_tensors(loaded)
    return kind, config, tensors


def export_model(config: ExportConfig) -> Path:
    """Write the checkpoint ``config.checkpoint`` as one model at ``config.out`` (see the module docstring);
    returns the path written. The output appears whole or not at all (a temporary beside it, then a rename).

    Raises:
        CheckpointError: the checkpoint is damaged or of no known family.
        ConfigError: ``out`` exists (without ``overwrite``).
    """
    loaded = open_checkpoint(config.checkpoint)
    kind, model_config, tensors = _sources(loaded)
    header = {"format": FORMAT, "family": kind, "step": loaded.step,
              "world_size": int(loaded.manifest["world_size"]), "config": model_config}
    nbytes = sum(t.nbytes if isinstance(t, RowBlocks) else t.numel() * t.element_size() for t in tensors.values())
    layout = config.layout
    if layout == "auto":
        free = available_bytes()
        layout = "folder" if free is not None and nbytes > free // 2 else "file"
        if layout == "folder":
            log.warning("the model's %s exceed half of the %s free: writing a memory-mappable folder",
                        format_bytes(nbytes), format_bytes(free))
    if layout == "folder":
        _write_folder(config.out, header, tensors, config.overwrite)
    else:
        if config.out.is_dir():
            raise ConfigError(f"{config.out} is a folder; expected a file name (or --layout folder)", field="out")
        whole = {k: t.whole() if isinstance(t, RowBlocks) else t for k, t in tensors.items()}
        with atomic_output(config.out, "wb") as f:
            torch.save({**header, "tensors": {k: v.contiguous() for k, v in whole.items()}}, f)
    log.info("exported %s (%s step %d, written by %d ranks) to %s", loaded.path, kind, loaded.step,
             header["world_size"], config.out)
    return config.out


def _write_folder(out: Path, header: dict, tensors: dict, overwrite: bool) -> None:
    index = {}
    with atomic_directory(out, overwrite=overwrite, ours=lambda p: (p / _HEADER).is_file(),
                          what="model folder") as tmp:
        for i, (name, t) in enumerate(tensors.items()):
            file = f"tensor-{i:04d}.npy"
            src = t if isinstance(t, RowBlocks) else RowBlocks(tuple(t.shape), t.dtype, lambda lo, hi, t=t: t[lo:hi])
            np_dtype = torch.empty((), dtype=src.dtype).numpy().dtype
            if not src.shape or src.shape[0] == 0:
                np.save(tmp / file, src.whole().numpy())
            else:
                arr = np.lib.format.open_memmap(tmp / file, mode="w+", dtype=np_dtype, shape=src.shape)
                row_bytes = max(1, src.nbytes // src.shape[0])
                step = max(1, _BLOCK_BYTES // row_bytes)
                for lo in range(0, src.shape[0], step):
                    hi = min(src.shape[0], lo + step)
                    arr[lo:hi] = src.read(lo, hi).numpy()  # (hi - lo, ...)
                arr.flush()
                del arr
            index[name] = {"file": file, "shape": list(src.shape), "dtype": str(np_dtype)}
        (tmp / _HEADER).write_text(json.dumps({**header, "tensors": index}, indent=1))


class _MappedTensors(Mapping):
    """A folder export's tensors, each memory-mapped when first asked for (copy-on-write: nothing is written
    back)."""

    def __init__(self, folder: Path, index: dict):
        self.folder, self.index, self._open = folder, index, {}

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._open:
            entry = self.index[name]
            file = self.folder / entry["file"]
            if not file.is_file():
                raise CheckpointError(f"{file}: missing (model.json lists it)")
            arr = np.load(file, mmap_mode="c")
            if list(arr.shape) != entry["shape"]:
                raise CheckpointError(f"{file}: shape {list(arr.shape)}, model.json says {entry['shape']}")
            self._open[name] = torch.from_numpy(arr)
        return self._open[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)


def load_model(path: str | Path) -> ModelFile:
    """A model from an export file, an export folder, or a checkpoint (folder or dir: exported in memory).

    Raises:
        FileNotFoundError: nothing at ``path``.
        CheckpointError: ``path`` is none of the three, or damaged.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"model {path} does not exist")
    if path.is_dir() and (path / _HEADER).is_file():
        try:
            header = json.loads((path / _HEADER).read_text())
        except (OSError, ValueError) as err:
            raise CheckpointError(f"{path / _HEADER}: unreadable ({err})") from None
        _check_header(header, path / _HEADER)
        return ModelFile(family=header["family"], config=header["config"], step=int(header["step"]),
                         world_size=int(header["world_size"]), tensors=_MappedTensors(path, header["tensors"]),
                         source=path)
    if path.is_dir():
        loaded = open_checkpoint(path)
        kind, config, tensors = _sources(loaded)
        whole = {k: t.whole() if isinstance(t, RowBlocks) else t for k, t in tensors.items()}
        return ModelFile(family=kind, config=config, step=loaded.step, world_size=int(loaded.manifest["world_size"]),
                         tensors=whole, source=loaded.path)
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # not a torch file, or one holding code
        raise CheckpointError(f"{path}: not a haloflow model ({type(err).__name__}: "
                              f"{str(err).splitlines()[0][:200] if str(err) else ''})") from None
    _check_header(blob, path)
    return ModelFile(family=blob["family"], config=blob["config"], step=int(blob["step"]),
                     world_size=int(blob["world_size"]), tensors=blob["tensors"], source=path)


def _check_header(header, where: Path) -> None:
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        found = header.get("format") if isinstance(header, dict) else type(header).__name__
        raise CheckpointError(f"{where}: not a {FORMAT} model (found {found!r}); export a checkpoint with "
                              "`haloflow export`")
    if header.get("family") not in FAMILIES:
        raise CheckpointError(f"{where}: family {header.get('family')!r} is none of {', '.join(FAMILIES)}")
    for key, kind in (("config", dict), ("step", int), ("world_size", int), ("tensors", dict)):
        if not isinstance(header.get(key), kind):
            raise CheckpointError(f"{where}: field {key!r} missing or not {kind.__name__}")


@dataclass(frozen=True)
class WholeRows:
    """A model's tables read the way a checkpoint's pieces are (``LoadedCheckpoint.rows`` / ``rows_at``), so that
    a family's own loader (``load_tables``, ``load_memory``) fills any K's shards from an export.

    ``arrays``: (table, name) -> the whole (rows, cols) or (rows,) array."""

    path: Path
    arrays: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)

    def rows(self, table: int, rows: tuple[int, int], cols: tuple[int, int], name: str) -> torch.Tensor:
        a = self._get(table, name)
        part = a[rows[0]:rows[1]]
        return (part if a.dim() == 1 else part[:, cols[0]:cols[1]]).clone()

    def rows_at(self, table: int, ids: torch.Tensor, name: str) -> torch.Tensor:
        return self._get(table, name)[ids.cpu().long()].clone()

    def has_rows(self, table: int, name: str) -> bool:
        return (table, name) in self.arrays

    def _get(self, table: int, name: str) -> torch.Tensor:
        if (table, name) not in self.arrays:
            raise CheckpointError(f"{self.path}: holds no {name!r} rows of table {table}")
        return self.arrays[(table, name)]
