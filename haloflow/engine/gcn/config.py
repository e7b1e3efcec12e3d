"""`GCNTrainConfig`: everything a GCN training run needs, validated once at construction (no torch: the launcher
checks a command line with it before any rank starts); `HaloConfig`, its halo exchange's (``parallelize.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from haloflow.data.paths import check_output_parent
from haloflow.engine.run_config import SCHEDULES, GradSyncConfig, RuntimeConfig, check_units
from haloflow.errors import ConfigError
from haloflow.models.config import CONVS, DEFAULT_KERNEL, KERNELS, MAX_LAYERS, GCNConfig
from haloflow.utils.atomic import check_file_replaceable
from haloflow.utils.config_flags import hidden, nested, option
from haloflow.utils.owned import torch_model

__all__ = ["GCNTrainConfig", "HaloConfig", "OPTIMIZERS"]

OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True, kw_only=True)
class HaloConfig:
    """How halos are exchanged during training.

    Args:
        staleness: 0 = exact; 1 = use the previous epoch's halo features and gradients (PipeGCN).
        halo_keep: fraction p of halo rows kept per training epoch (BNS-GCN); 1.0 = all (exact).
        seed: key of the halo sampling (together with the epoch).
        schedule: "overlap" (start the exchange, compute the inner rows, then wait) or "wait_first" (wait before
            any inner compute, in forward and backward): the control that ``haloflow bench gcn-dist`` times against
            the overlapped schedule; both give the same numbers.
    """

    staleness: int = option(0, help="1: use the previous epoch's halos (PipeGCN; one part per rank, not bitwise "
                            "across K)")
    halo_keep: float = option(1.0, help="< 1: sample halo rows (BNS-GCN; one part per rank, not bitwise across K)")
    seed: int = hidden(0, why="the trainer's seed (GCN: --seed)")
    schedule: str = hidden("overlap", why="the control `haloflow bench gcn-dist` times the overlap against")

    def __post_init__(self) -> None:
        if self.staleness not in (0, 1):
            raise ConfigError(f"staleness must be 0 (exact) or 1 (previous epoch's halos), got {self.staleness}",
                              field="staleness")
        if not 0.0 < self.halo_keep <= 1.0:
            raise ConfigError(f"halo_keep must be in (0, 1], got {self.halo_keep}", field="halo_keep")
        if self.staleness and self.halo_keep < 1.0:
            raise ConfigError("choose one approximation: staleness=1 or halo_keep < 1, not both", field="staleness")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}", field="schedule")

    @property
    def exact(self) -> bool:
        return self.staleness == 0 and self.halo_keep == 1.0


@dataclass(frozen=True, kw_only=True)
class GCNTrainConfig:
    """Everything a GCN training run needs. Defaults are Kipf & Welling's Cora setting (FACTS.md).

    Exactly one input: ``dataset`` (a path any ``haloflow.data.read_dataset`` format; single process) or
    ``partitions`` (a folder written by ``haloflow partition`` of V parts; each of K ranks loads V / K of them, and
    the run computes the same floats at every K that divides V with a power of two per rank). The halo exchange,
    the gradient sync and the runtime (device, timeout, output) have configs of their own, nested here.
    """

    dataset: str | None = option(None, metavar="PATH",
                                 help="a data set (SNAP, PACE, OGB folder, Planetoid folder): one process")
    partitions: str | None = option(None, metavar="DIR",
                                    help="a partition folder from `haloflow partition`; its V parts define the run: any --nproc K dividing V "
                                    "(V / K a power of two) trains the same model bit for bit")
    dataset_format: str = option("auto", "--format", help="format of --dataset")
    reader_options: tuple[tuple[str, object], ...] = hidden(  # e.g. (("one_based", True),): passed to read_dataset
        (), why="the reader flags (--num-nodes, --one-based, --name, --split), shared with `haloflow partition`")
    # GCN expects an undirected graph; `haloflow partition` symmetrises the same way
    symmetrize: bool = option(True, "--directed", negate=True, help="with --dataset: do not symmetrise the graph")
    # divide each row by its sum (the GCN paper's preprocessing); per node, so any K
    normalize_features: bool = option(True, "--no-normalize", negate=True,
                                      help="keep the features as they are (no row sums of 1)")
    # model
    hidden_dim: int = option(16, "--hidden", help="width of the hidden layers")
    num_layers: int = option(2, "--layers", help=f"graph convolutions (at most {MAX_LAYERS:,})")
    dropout: float = option(0.5, help="dropout probability")
    conv: str = option("gcn", help=" or ".join(CONVS))
    seed: int = option(0, help="weights, dropout masks and halo sampling")
    # layer 0's A X once, its dropout on A X (False: Kipf's dropout on X)
    precompute_first: bool = option(True, "--no-precompute", negate=True,
                                    help="Kipf's layer 0 (dropout on X, A X every epoch) instead of A X once with "
                                    "dropout on A X")
    kernel: str = option(DEFAULT_KERNEL, help=f"SpMM kernel on CPU: {' or '.join(KERNELS)}")
    # optimisation
    epochs: int = option(200, help="full-batch epochs")
    # FACTS.md: Kipf & Welling's Adam lr 0.01. Plain SGD does not blow up at it but barely learns: Cora after 200
    # epochs, measured here, val accuracy 0.13 at 0.01, 0.37 at 0.5, 0.46 at 1, unstable from 2 on.
    lr: float = option(0.01, help="learning rate (Adam's, as in the GCN paper; --optimizer sgd learns far more "
                       "slowly at any rate)")
    weight_decay: float = option(5e-4, help="on layer 0's weights only, as in the GCN paper")
    optimizer: str = option("adam", help=" or ".join(OPTIMIZERS))
    # distribution and output
    halo: HaloConfig = nested(HaloConfig, "halo exchange", follow={"seed": "seed"})
    grad_sync: GradSyncConfig = nested(GradSyncConfig, "gradient sync")
    runtime: RuntimeConfig = nested(RuntimeConfig, "running")
    save: str | None = option(None, metavar="FILE", help="save the final model state (rank 0)")

    def _check_applies(self) -> None:
        """A flag that does nothing for this input is a mistake, said with the flag that makes it apply."""
        if self.partitions is not None:  # the partition folder fixed the graph already
            if not self.symmetrize:
                raise ConfigError("--directed applies only to --dataset (a partition folder's graph is fixed when "
                                  "it is partitioned: `haloflow partition --no-symmetrize`)", field="symmetrize")
            given = [name for name, value in self.reader_options if value is not None]
            if given:
                raise ConfigError(f"--{given[0].replace('_', '-')} applies only to --dataset (a partition folder "
                                  "was read when it was partitioned)", field="reader_options")
        if self.dataset is not None:  # one process: no halos to be stale or sampled
            if self.halo.staleness:
                raise ConfigError("--staleness applies only to --partitions (halos between parts); --dataset trains "
                                  "one process with no halos", field="halo")
            if self.halo.halo_keep < 1.0:
                raise ConfigError("--halo-keep applies only to --partitions (halos between parts); --dataset trains "
                                  "one process with no halos", field="halo")

    def __post_init__(self) -> None:
        if (self.dataset is None) == (self.partitions is None):
            raise ConfigError("give exactly one input: a dataset path (single process) or a partitions folder",
                              field="dataset")
        for name in ("epochs", "hidden_dim", "num_layers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}", field=name)
        check_units(self.epochs, "epochs")
        self._check_applies()
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
        check_file_replaceable(self.save, self.runtime.overwrite, torch_model, "--save")
        if self.save is not None and self.runtime.log_jsonl is not None and (
                Path(self.save).resolve() == Path(self.runtime.log_jsonl).resolve()):
            raise ConfigError(f"save and log_jsonl (--save, --log-jsonl) both name {self.save}: expected two files",
                              field="save")
        check_output_parent(self.runtime.log_jsonl, "--log-jsonl")
        ckpt = self.runtime.checkpoint
        if self.halo.staleness and (ckpt.dir is not None or ckpt.resume is not None):
            raise ConfigError("staleness 1 carries last epoch's halos from epoch to epoch, and a checkpoint does not "
                              "hold them: checkpoints and resume need staleness 0", field="halo.staleness")

    def model_config(self, in_dim: int, out_dim: int) -> GCNConfig:
        return GCNConfig(in_dim=in_dim, out_dim=out_dim, hidden_dim=self.hidden_dim, num_layers=self.num_layers,
                         dropout=self.dropout, conv=self.conv, seed=self.seed, precompute_first=self.precompute_first)
