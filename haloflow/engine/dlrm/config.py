"""`DLRMTrainConfig`: one DLRM training run, validated once at construction."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from haloflow.data.paths import check_output_parent
from haloflow.engine.run_config import RuntimeConfig, check_units
from haloflow.errors import ConfigError
from haloflow.utils.config_flags import follows, nested, option

__all__ = ["DLRMTrainConfig", "ROW_OPTIMIZERS", "DEFAULT_LR", "optimizer_name"]

ROW_OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad")
# The learning rate when none is given. SGD: the Kaggle DLRM's 0.1 (FACTS.md). Adagrad's first step moves every
# weight by about lr whatever the size of its gradient, so 0.1 throws the MLPs far (loss 2,979 at step 2 of the
# synthetic log); 0.01 is torch.optim.Adagrad's default and FBGEMM's (its fused row-wise Adagrad too), and
# trains the synthetic log to about the loss SGD reaches (0.48 at step 40, validation AUC 0.78).
DEFAULT_LR = {"sgd": 0.1, "adagrad": 0.01, "rowwise_adagrad": 0.01}


def optimizer_name(text: str) -> str:
    """``rowwise-adagrad`` (as ``haloflow plan-tables`` spells it) or ``rowwise_adagrad`` -> ``rowwise_adagrad``."""
    return text.strip().lower().replace("-", "_")


@dataclass(frozen=True, kw_only=True)
class DLRMTrainConfig:
    """One training run.

    Args:
        data: a folder written by ``haloflow preprocess criteo`` (or the synthetic writer); or None with
            ``synthetic``.
        synthetic: train on the synthetic Criteo-like log instead (``haloflow.data.clicks``).
        synthetic_scale / synthetic_max_rows: table sizes of the synthetic log (Kaggle cardinalities scaled,
            then capped).
        synthetic_train / synthetic_val: samples in its train and validation splits.
        plan: a ``ShardingPlan`` JSON file; None uses ``table_wise_plan`` (whole tables spread over ranks).
        batch_size: global batch B, split over the ranks.
        lr: learning rate (MLPs and tables alike); None: ``DEFAULT_LR`` of the optimizer (SGD 0.1, Adagrad and
            row-wise Adagrad 0.01).
        epochs / max_steps: stop after ``epochs`` passes or ``max_steps`` steps, whichever comes first.
        log_every: steps between JSON training records (and printed lines when no progress bar shows).
        max_eval_batches: cap on validation batches (None: the whole split).
        embedding_dim, bottom_mlp, top_mlp, seed: the model (``DLRMConfig``).
        dp_grad: "sparse" or "dense" sum of data-parallel tables' gradients.
        optimizer: "sgd", "adagrad" or "rowwise_adagrad" (or "rowwise-adagrad") for the tables (fused into their
            row stores for the last two; the MLPs use torch's SGD or Adagrad, row-wise Adagrad being for rows
            only). Sharded too; row-wise Adagrad refuses a column-wise table (its per-row accumulator needs every
            column).
        cache_ratio: keep this fraction of each table's rows in a software cache on the device, the rest (and
            the optimizer state) in host memory (``haloflow.cache``); None: the tables wholly on the device.
            Sharded, the fraction is of each shard's and replica's rows; a plan's ``cached`` tables have caches
            of their planned size with or without it.
        cache_policy: "lru", "lfu", "frequency" (ranks rows by their count in the batches this run trains on)
            or "lookahead" (the trainer reads the next ``cache_window`` batches ahead and tells the cache their
            rows: Belady within them, a miss cached only when used again sooner than its victim; every table table-
            or column-wise, as the default plan).
        cache_window: batches ahead the lookahead policy sees (>= 1).
        runtime: device, timeout and output (``RuntimeConfig``; ``log_jsonl`` gets every JSON record).
    """

    data: Path | None = option(None, metavar="DIR", help="folder written by `haloflow preprocess criteo`")
    synthetic: bool = option(False, help="train on the synthetic Criteo-like click log")
    # Kaggle's 33.8 M rows -> ~34 k rows: a laptop-sized run
    synthetic_scale: float = option(1e-3, help="Kaggle table sizes times this")
    synthetic_max_rows: int | None = option(None, means="no cap", help="cap on a synthetic table's rows")
    synthetic_train: int = option(65_536, help="synthetic training samples")
    synthetic_val: int = option(8_192, help="synthetic validation samples")
    plan: Path | None = option(None, metavar="PLAN", means="whole tables spread over the ranks",
                               help="sharding plan JSON (`haloflow plan-tables`)")
    batch_size: int = option(128, help="global batch, split over the ranks")  # FACTS.md: the Kaggle DLRM's batch
    lr: float | None = option(None, means="per optimizer: " + ", ".join(f"{k} {v:g}" for k, v in DEFAULT_LR.items()),
                              help="learning rate of the MLPs and tables alike")
    epochs: int = option(1, help="passes over the training split")
    max_steps: int | None = option(None, means="the whole epochs", help="stop after this many steps")
    log_every: int = follows(100, "runtime.log_every")  # --log-every N: a JSON record every N steps too
    max_eval_batches: int | None = option(None, means="the whole split", help="cap on validation batches")
    embedding_dim: int = option(16, help="width of every embedding row")
    bottom_mlp: tuple[int, ...] = option((512, 256, 64), metavar="W,W,..", help="widths of the dense features' MLP")
    top_mlp: tuple[int, ...] = option((512, 256), metavar="W,W,..", help="widths of the MLP over the interactions")
    seed: int = option(0, help="weights and the synthetic log")
    # float64 is for parity checks: K ranks then agree with one process far beyond float32 rounding (float32
    # rounding differs with K, since each rank sums its own slice's gradients, and a ReLU input that rounding
    # moves across 0 makes the runs part; see engine/dlrm/parallelize.py)
    dtype: str = option("float32", choices=("float32", "float64"), help="floating type of the MLPs and tables "
                        "(float64: for parity checks; not with --cache-ratio)")
    dp_grad: str = option("sparse", choices=("sparse", "dense"), help="how data-parallel tables' gradients are summed "
                          "(dense: per rank, then over ranks; only with --no-k-invariance)")
    # V, not K, defines the run (engine/logical.py): the global batch is cut into V slices, the plan made for V
    # logical ranks, and every sum over them taken in one order, so --nproc 1, 2, 4 train the same floats
    logical_workers: int | None = option(None, metavar="V", means="a --plan's ranks, else 4 (or --nproc when larger)",
                                         help="logical workers: the run's floats depend on V, not on --nproc "
                                         "(any --nproc that divides V with a power of two per rank)")
    no_k_invariance: bool = option(False, help="give up equal floats at every --nproc: V = --nproc, each rank one "
                                   "product over its samples (the default's price on 2 CPU cores, batch 128: "
                                   "0.98-1.08x the step time at --nproc 1, none at --nproc 2; `haloflow bench "
                                   "exactness`)")
    optimizer: str = option("sgd", choices=ROW_OPTIMIZERS, parse=optimizer_name, help="optimizer of the tables "
                            "(rowwise-adagrad is rowwise_adagrad; adagrad and "
                            "rowwise_adagrad keep their state with the rows; the MLPs then use Adagrad)")
    cache_ratio: float | None = option(
        None, metavar="R", means="whole tables on the device", help="keep this fraction of each table's rows in a "
        "software cache on the device, the rest in host memory (e.g. 0.01; with --nproc/--plan, of each shard's "
        "rows; a rank's tables share one cache of the summed size); a plan's cached tables get their planned "
        "caches either way")
    cache_policy: str = option("lru", choices=("lru", "lfu", "frequency", "lookahead"),
                               help="which rows stay cached (lookahead: Belady within the next --cache-window "
                                    "batches, which the trainer reads ahead; table- and column-wise shards)")
    cache_window: int = option(16, metavar="W", help="batches ahead the lookahead cache policy sees")
    runtime: RuntimeConfig = nested(lambda: RuntimeConfig(timeout_s=300.0), "running")

    def __post_init__(self) -> None:
        if (self.data is None) == (not self.synthetic):
            raise ConfigError("give exactly one of data (a preprocessed folder) and synthetic=True", field="data")
        for name in ("batch_size", "epochs", "log_every", "synthetic_train"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}", field=name)
        if self.synthetic_val < 0:
            raise ConfigError(f"synthetic_val must be >= 0, got {self.synthetic_val}", field="synthetic_val")
        for name in ("epochs", "max_steps"):
            check_units(getattr(self, name), name)
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"max_steps must be >= 1 or None, got {self.max_steps}", field="max_steps")
        if self.max_eval_batches is not None and self.max_eval_batches < 1:  # 0 would end in a NaN AUC
            raise ConfigError(f"max_eval_batches must be >= 1 (validation batches to score), got "
                              f"{self.max_eval_batches}", field="max_eval_batches")
        object.__setattr__(self, "optimizer", optimizer_name(self.optimizer))
        if self.optimizer not in ROW_OPTIMIZERS:
            raise ConfigError(f"optimizer must be one of {ROW_OPTIMIZERS}, got {self.optimizer!r}", field="optimizer")
        if self.lr is None:
            object.__setattr__(self, "lr", DEFAULT_LR[self.optimizer])
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"lr must be a finite number > 0, got {self.lr}", field="lr")
        if self.dtype not in ("float32", "float64"):
            raise ConfigError(f"dtype must be float32 or float64, got {self.dtype!r}", field="dtype")
        if self.dtype != "float32" and self.cache_ratio is not None:
            raise ConfigError(f"dtype {self.dtype}: a cache (cache_ratio {self.cache_ratio}) holds float32 rows; "
                              "expected dtype float32 with a cache, or no cache_ratio", field="dtype")
        if not 1 <= self.cache_window <= 4096:
            raise ConfigError(f"cache_window must be in 1..4096 batches, got {self.cache_window}", field="cache_window")
        if self.cache_ratio is not None and not 0 < self.cache_ratio <= 1:
            raise ConfigError(f"cache_ratio must be in (0, 1], got {self.cache_ratio}", field="cache_ratio")
        if self.dp_grad not in ("sparse", "dense"):
            raise ConfigError(f"dp_grad must be 'sparse' or 'dense', got {self.dp_grad!r}", field="dp_grad")
        if self.dp_grad == "dense" and not self.no_k_invariance:
            raise ConfigError("'dense' sums each rank's gradient of a replicated table, then the ranks': the floats "
                              "would change with --nproc; expected 'sparse', or --no-k-invariance with it",
                              field="dp_grad")
        if self.logical_workers is not None and self.no_k_invariance:
            raise ConfigError("V is set here, but --no-k-invariance makes V = --nproc: give one of them",
                              field="logical_workers")
        if self.logical_workers is not None and not 1 <= self.logical_workers <= 4096:
            raise ConfigError(f"logical_workers must be in 1..4096, got {self.logical_workers}",
                              field="logical_workers")
        check_output_parent(self.runtime.log_jsonl, "--log-jsonl")  # checked now, not at the first record
        for name in ("data", "plan"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        object.__setattr__(self, "bottom_mlp", tuple(self.bottom_mlp))
        object.__setattr__(self, "top_mlp", tuple(self.top_mlp))
