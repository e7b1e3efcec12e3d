"""DLRM after training: its export (``export_tensors``) and `predict_dlrm`, one click probability per row.

::

    export    the MLPs by the single-device DLRM's names (bottom.*, top.*) and every table whole,
              embeddings.tables.<t>.weight, cut out of whatever rectangles the K ranks saved (read block by block
              of rows for a folder export); the optimizer's state is left behind
    predict   DLRMFamily.setup on --data (or --synthetic): the trainer's data path and sharded model at this K
              (whole tables spread over the ranks), the MLPs and tables filled from the model,
              score_split: every row of the split, gathered in row order -> row, label, probability;
              log-loss and AUC as the trainer computes them (click_metrics)
    --embeddings  the rows of table --table, straight from the model
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from haloflow.engine.export import ModelFile, RowBlocks, WholeRows, load_model
from haloflow.engine.predict import PredictResult, check_table_path, predict_runtime, write_table
from haloflow.engine.run_config import DEVICES
from haloflow.engine.runtime import Runtime
from haloflow.errors import ConfigError
from haloflow.utils.config_flags import option

__all__ = ["DLRMPredictConfig", "predict_dlrm", "export_tensors"]


def export_tensors(loaded) -> tuple[dict, dict[str, torch.Tensor | RowBlocks]]:
    """The checkpoint's identity (table sizes, widths, seed, batch) and the single-device DLRM's tensors."""
    identity = dict(loaded.manifest["identity"])
    D = int(identity["embedding_dim"])
    tensors: dict[str, torch.Tensor | RowBlocks] = dict(loaded.state["dense"]["weights"])
    dtype = next(iter(tensors.values())).dtype if tensors else torch.float32
    for t, n in enumerate(identity["table_sizes"]):
        tensors[f"embeddings.tables.{t}.weight"] = RowBlocks(
            (int(n), D), dtype, lambda lo, hi, t=t: loaded.rows(t, (lo, hi), (0, D), "weight").to(dtype))
    return identity, tensors


@dataclass(frozen=True, kw_only=True)
class DLRMPredictConfig:
    """``haloflow predict dlrm``: the click probability of every row of a split under a trained DLRM.

    Args:
        model: an export (``haloflow export``) or a checkpoint of a DLRM run.
        data: a folder written by ``haloflow preprocess criteo``; or ``synthetic`` with the training's
            ``synthetic_*`` sizes. Its table sizes and dense width must be the model's.
        split: "val" (what the trainer evaluates) or "train".
        batch_size: rows scored at once (None: the training's batch).
        max_batches: score the first this many batches (the trainer's ``max_eval_batches``; None: all).
        out: the table to write (.parquet or .csv): row, label, probability.
        embeddings / table: also write the rows of table ``table`` here.
    """

    model: Path = option(metavar="MODEL", help="a model from `haloflow export`, or a DLRM checkpoint")
    data: Path | None = option(None, metavar="DIR", help="folder written by `haloflow preprocess criteo`")
    synthetic: bool = option(False, help="score the synthetic click log (its sizes as trained)")
    synthetic_scale: float = option(1e-3, help="with --synthetic: Kaggle table sizes times this")
    synthetic_max_rows: int | None = option(None, means="no cap", help="with --synthetic: cap on a table's rows")
    synthetic_train: int = option(65_536, help="with --synthetic: training samples")
    synthetic_val: int = option(8_192, help="with --synthetic: validation samples")
    split: str = option("val", choices=("val", "train"), help="the split to score")
    batch_size: int | None = option(None, means="the training's", help="rows scored at once")
    max_batches: int | None = option(None, means="the whole split", help="score only the first N batches")
    out: Path = option(metavar="FILE", help="where to write one row per scored row (.parquet or .csv)")
    embeddings: Path | None = option(None, metavar="FILE",
                                     help="also write the rows of table --table (.parquet or .csv)")
    table: int = option(0, help="the table --embeddings writes")
    device: str = option("auto", choices=DEVICES, means="CUDA when present", help="where each rank computes")
    timeout_s: float = option(300.0, "--timeout", metavar="S", help="seconds a rank waits for a silent peer")
    overwrite: bool = option(False, help="replace a file at --out or --embeddings that predict did not write (one "
                             "it wrote is replaced anyway)")

    def __post_init__(self) -> None:
        if (self.data is None) == (not self.synthetic):
            raise ConfigError("give exactly one of --data (a preprocessed folder) and --synthetic", field="data")
        object.__setattr__(self, "model", Path(self.model))
        if not self.model.exists():
            raise FileNotFoundError(f"model {self.model} does not exist")
        if self.data is not None:
            object.__setattr__(self, "data", Path(self.data))
            if not self.data.is_dir():
                raise FileNotFoundError(f"data folder {self.data} does not exist")
        for name in ("batch_size", "max_batches"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}", field=name)
        if self.table < 0:
            raise ConfigError(f"table must be >= 0, got {self.table}", field="table")
        object.__setattr__(self, "out", check_table_path(self.out, "--out", self.overwrite))
        object.__setattr__(self, "embeddings", check_table_path(self.embeddings, "--embeddings", self.overwrite))
        predict_runtime(self.device, self.timeout_s)

    def train_config(self, model: ModelFile):
        """The trainer's config that rebuilds ``model`` on this input: whole tables spread over the ranks,
        parameters (no row stores: nothing is trained)."""
        from haloflow.engine.dlrm.config import DLRMTrainConfig

        m = model.config
        dtype = model.tensors["bottom.0.weight"].dtype if "bottom.0.weight" in model.tensors else torch.float32
        return DLRMTrainConfig(
            data=self.data, synthetic=self.synthetic, synthetic_scale=self.synthetic_scale,
            synthetic_max_rows=self.synthetic_max_rows, synthetic_train=self.synthetic_train,
            synthetic_val=self.synthetic_val, batch_size=self.batch_size or int(m["batch_size"]),
            embedding_dim=int(m["embedding_dim"]), bottom_mlp=tuple(m["bottom_mlp"]), top_mlp=tuple(m["top_mlp"]),
            seed=int(m["seed"]), dtype="float64" if dtype == torch.float64 else "float32",
            logical_workers=m.get("logical_workers"),  # the trainer's slices: its evaluation's bits, at any K
            max_eval_batches=self.max_batches, runtime=predict_runtime(self.device, self.timeout_s))


def predict_dlrm(config: DLRMPredictConfig) -> PredictResult:
    """Score every row of the split (see the module docstring); every rank returns the same result.

    Raises:
        ConfigError: a model of another family, or data whose table sizes or dense width differ from the model's.
    """
    from haloflow.engine.dlrm.checkpoint import load_dense_state, load_tables
    from haloflow.engine.dlrm.train import DLRMFamily, click_metrics, score_split

    model = load_model(config.model)
    model.expect_family("dlrm")
    n = len(model.config["table_sizes"])
    if config.embeddings is not None and config.table >= n:
        raise ConfigError(f"--table {config.table}: the model has {n} tables (0 .. {n - 1})", field="table")
    train_config = config.train_config(model)
    fam = DLRMFamily(train_config)
    with Runtime.start(train_config.runtime, join=True) as rt:
        fam.setup(rt)
        _check_data(model, fam.data, config)
        dense = {k: v for k, v in model.tensors.items() if not k.startswith("embeddings.")}
        load_dense_state(fam.net.model, fam.opt, {"weights": dense, "optimizer": {}}, model.source)
        tables = {(t, "weight"): model.tensors[f"embeddings.tables.{t}.weight"]
                  for t in range(len(model.config["table_sizes"]))}
        load_tables(fam.net.embeddings, WholeRows(model.source, tables))
        ids, logits, labels = score_split(fam.net, fam.data, rt.layout, train_config, config.split,
                                          config.max_batches)
        logloss, auc = click_metrics(logits, labels)
        metrics = {f"{config.split}_logloss": logloss, f"{config.split}_auc": auc}
        if rt.layout.is_main:
            write_table(config.out, {"row": ids.numpy(), "label": labels.float().numpy(),
                                     "probability": torch.sigmoid(logits).float().numpy()})
            if config.embeddings is not None:
                _write_table_rows(model, config)
        return PredictResult(family="dlrm", rows=int(ids.numel()), metrics=metrics, out=config.out,
                             embeddings=config.embeddings, rank=rt.layout.rank, step=model.step)


def _check_data(model: ModelFile, data, config: DLRMPredictConfig) -> None:
    where = config.data or "the synthetic log (--synthetic-*)"
    theirs = [int(n) for n in model.config["table_sizes"]]
    ours = [int(n) for n in data.table_sizes]
    if ours != theirs:
        diff = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        found = ours[diff] if diff < len(ours) else "none"
        wanted = theirs[diff] if diff < len(theirs) else "none"
        raise ConfigError(f"{where}: {len(ours)} tables, table {diff} has {found} rows, but the model "
                          f"{model.source} was trained on {len(theirs)} tables with {wanted} rows there: expected "
                          "the data the model was trained on (the same vocabularies)", field="data")
    if int(data.num_dense) != int(model.config["num_dense"]):
        raise ConfigError(f"{where}: {data.num_dense} dense features, but the model {model.source} takes "
                          f"{model.config['num_dense']}", field="data")


def _write_table_rows(model: ModelFile, config: DLRMPredictConfig) -> None:
    w = model.tensors[f"embeddings.tables.{config.table}.weight"].float().numpy()  # (rows, D)
    write_table(config.embeddings, {"row": np.arange(w.shape[0], dtype=np.int64),
                                    **{f"e_{j}": w[:, j] for j in range(w.shape[1])}})
