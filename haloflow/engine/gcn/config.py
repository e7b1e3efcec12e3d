"""`GCNTrainConfig`: everything a GCN training run needs, validated once at construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from haloflow.data.paths import check_output_parent
from haloflow.engine.gcn.parallelize import HaloConfig
from haloflow.engine.grad_sync import GradSyncConfig
from haloflow.engine.runtime import RuntimeConfig
from haloflow.errors import ConfigError
from haloflow.models.gcn import CONVS, MAX_LAYERS, GCNConfig
from haloflow.models.spmm import DEFAULT_KERNEL, KERNELS

__all__ = ["GCNTrainConfig", "OPTIMIZERS"]

OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True, kw_only=True)
class GCNTrainConfig:
    """Everything a GCN training run needs. Defaults are Kipf & Welling's Cora setting (FACTS.md).

    Exactly one input: ``dataset`` (a path any ``haloflow.data.read_dataset`` format; single process) or
    ``partitions`` (a folder written by ``haloflow partition``; rank r of K loads part r). The halo exchange,
    the gradient sync and the runtime (device, timeout, output) have configs of their own, nested here.
    """

    dataset: str | None = None
    partitions: str | None = None
    dataset_format: str = "auto"
    reader_options: tuple[tuple[str, object], ...] = ()  # e.g. (("one_based", True),): passed to read_dataset
    symmetrize: bool = True  # GCN expects an undirected graph; `haloflow partition` symmetrises the same way
    normalize_features: bool = True  # divide each row by its sum (the GCN paper's preprocessing); per node, so any K
    # model
    hidden_dim: int = 16
    num_layers: int = 2
    dropout: float = 0.5
    conv: str = "gcn"
    seed: int = 0  # weights and dropout masks
    precompute_first: bool = True  # layer 0's A X once, its dropout on A X (False: Kipf's dropout on X)
    kernel: str = DEFAULT_KERNEL
    # optimisation
    epochs: int = 200
    lr: float = 0.01
    weight_decay: float = 5e-4  # on layer 0's weights only, as in the GCN paper
    optimizer: str = "adam"
    # distribution and output
    halo: HaloConfig = field(default_factory=HaloConfig)
    grad_sync: GradSyncConfig = field(default_factory=GradSyncConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    save: str | None = None

    def __post_init__(self) -> None:
        if (self.dataset is None) == (self.partitions is None):
            raise ConfigError("give exactly one input: a dataset path (single process) or a partitions folder",
                              field="dataset")
        for name in ("epochs", "hidden_dim", "num_layers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}", field=name)
        if self.num_layers > MAX_LAYERS:
            raise ConfigError(f"num_layers must be <= {MAX_LAYERS:,}, got {self.num_layers:,}", field="num_layers")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"lr must be a finite number > 0, got {self.lr}", field="lr")
        if not (self.weight_decay >= 0 and math.isfinite(self.weight_decay)):
            raise ConfigError(f"weight_decay must be a finite number >= 0, got {self.weight_decay}",
                              field="weight_decay")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}", field="optimizer")
        if self.conv not in CONVS:
            raise ConfigError(f"conv must be one of {CONVS}, got {self.conv!r}", field="conv")
        if self.kernel not in KERNELS:
            raise ConfigError(f"kernel must be one of {KERNELS}, got {self.kernel!r}", field="kernel")
        if self.save is not None and Path(self.save).is_dir():
            raise ConfigError(f"save {self.save} is a folder; expected a file name to write", field="save")
        check_output_parent(self.save, "--save")  # checked now: the file is written after training
        if self.save is not None and self.runtime.log_jsonl is not None and (
                Path(self.save).resolve() == Path(self.runtime.log_jsonl).resolve()):
            raise ConfigError(f"save and log_jsonl (--save, --log-jsonl) both name {self.save}: expected two files",
                              field="save")
        check_output_parent(self.runtime.log_jsonl, "--log-jsonl")
        ckpt = self.runtime.checkpoint
        if self.halo.staleness and (ckpt.dir is not None or ckpt.resume is not None):
            raise ConfigError("staleness 1 carries last epoch's halos from epoch to epoch, and a checkpoint does not "
                              "hold them: checkpoints and resume need staleness 0", field="staleness")

    def model_config(self, in_dim: int, out_dim: int) -> GCNConfig:
        return GCNConfig(in_dim=in_dim, out_dim=out_dim, hidden_dim=self.hidden_dim, num_layers=self.num_layers,
                         dropout=self.dropout, conv=self.conv, seed=self.seed, precompute_first=self.precompute_first)
