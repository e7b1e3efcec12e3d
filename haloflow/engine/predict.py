"""What every family's ``predict_<family>`` shares: the output table, the result, the runtime of a scoring run.

::

    predict_gcn / predict_dlrm / predict_tgn (haloflow/engine/<family>/predict.py)
      load_model(--model)                 an export file or folder, or a checkpoint (engine/export.py)
      Runtime.start                       one process, or K ranks under torchrun, as training
      the family's setup + its weights    the trainer's own data path and distributed model
      score                               the trainer's own evaluation, every row kept with its id
      rank 0: write_table(--out)          Parquet, or CSV by the file's extension, written atomically
      -> PredictResult                    the trainer's metrics where the input has labels

Scores do not depend on K: each family scores every row the way its trainer evaluates it, and the ranks'
rows are put back in id order before anything is written or summed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from haloflow.engine.run_config import DEVICES, RuntimeConfig
from haloflow.errors import ConfigError
from haloflow.utils.atomic import atomic_output, check_file_replaceable
from haloflow.utils.owned import WRITTEN_BY, predict_table

__all__ = ["PredictResult", "write_table", "check_table_path", "predict_runtime", "TABLE_SUFFIXES"]

TABLE_SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}

log = logging.getLogger(__name__)


def check_table_path(path: Path | None, flag: str, overwrite: bool = False) -> Path | None:
    """``path`` as a Path, checked before any work: a known suffix, not a folder, and a file already there only
    when predict wrote it (its metadata or header, ``utils/owned.py``) or with ``overwrite``."""
    if path is None:
        return None
    path = Path(path)
    if path.suffix.lower() not in TABLE_SUFFIXES:
        raise ConfigError(f"{flag} {path}: expected a .parquet (or .pq) or .csv file name, got suffix "
                          f"{path.suffix or '(none)'!r}", field=flag.lstrip("-").replace("-", "_"))
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a folder; expected a file name", field=flag.lstrip("-").replace("-", "_"))
    check_file_replaceable(path, overwrite, predict_table, flag)
    return path


def predict_runtime(device: str, timeout_s: float) -> RuntimeConfig:
    """The runtime of a scoring run: the trainer's (the same reproducible threads), no bar, no log file."""
    if device not in DEVICES:
        raise ConfigError(f"device must be one of {DEVICES}, got {device!r}", field="device")
    return RuntimeConfig(device=device, timeout_s=timeout_s, progress=False)


def write_table(path: Path, columns: dict[str, np.ndarray]) -> Path:
    """One row per entry of the equal-length ``columns``, as Parquet or CSV (by ``path``'s suffix), atomically."""
    import pyarrow as pa

    table = pa.table({name: np.ascontiguousarray(col) for name, col in columns.items()},
                     metadata={WRITTEN_BY: "haloflow predict"})  # a later run may replace it (utils/owned.py)
    kind = TABLE_SUFFIXES[path.suffix.lower()]
    with atomic_output(path, "wb") as f:
        if kind == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, f)
        else:
            import pyarrow.csv as pcsv

            pcsv.write_csv(table, f)
    log.info("wrote %d rows to %s", table.num_rows, path)
    return path


@dataclass(frozen=True)
class PredictResult:
    """What a scoring run returns on every rank: the metrics (the trainer's names; {} without labels), the rows
    scored, and the files rank 0 wrote."""

    family: str
    rows: int
    metrics: dict[str, float] = field(default_factory=dict)
    out: Path | None = None
    embeddings: Path | None = None
    rank: int = 0
    step: int = 0  # the training step (epoch, batch) the model is from

    def summary(self) -> str:
        lines = [f"{self.family.upper()} model at {self.step}: {self.rows:,} rows scored"]
        lines += [f"  {k:<24} {v!r}" for k, v in self.metrics.items()]  # repr: every digit, to compare
        lines += [f"  wrote {p}" for p in (self.out, self.embeddings) if p is not None]
        return "\n".join(lines)
