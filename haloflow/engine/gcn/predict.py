"""GCN after training: its export (``export_tensors``) and `predict_gcn`, every node's class and probabilities.

::

    export    the checkpoint's state["model"]: the single-device GCN's state dict (the same on every rank)
    predict   GCNFamily.setup on --dataset (one process) or --partitions (V / K parts per rank, as the trainer), the
              model's weights,
              one evaluation forward (no dropout, exact halos) -> logits (n_own, C) per rank
              accuracy per split from summed counts (the trainer's EpochLog); rows gathered to rank 0 in
              original-id order -> node_id, split, label, predicted class, prob_0 .. prob_{C-1}
    --embeddings  the last hidden layer (relu of layer L-2's output, what layer L-1 reads) per node: a GCN of the
              first L-1 layers with the same weights, run on the same aggregator
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from haloflow.engine.comm import all_gather_cat, all_gather_rows
from haloflow.engine.export import ModelFile, load_model
from haloflow.engine.gcn.config import GCNTrainConfig
from haloflow.engine.predict import PredictResult, check_table_path, predict_runtime, write_table
from haloflow.engine.run_config import DEVICES
from haloflow.engine.runtime import Runtime
from haloflow.errors import ConfigError
from haloflow.utils.config_flags import hidden, option

__all__ = ["GCNPredictConfig", "predict_gcn", "export_tensors", "SPLITS"]

SPLITS = ("all", "train", "val", "test")


def export_tensors(loaded) -> tuple[dict, dict[str, torch.Tensor]]:
    """The config that rebuilds the model (the checkpoint's identity) and the single-device GCN's state dict."""
    return dict(loaded.manifest["identity"]), dict(loaded.state["model"])


@dataclass(frozen=True, kw_only=True)
class GCNPredictConfig:
    """``haloflow predict gcn``: every node's class and class probabilities under a trained GCN.

    Args:
        model: an export (``haloflow export``) or a checkpoint of a GCN run.
        dataset / partitions: the graph, as for training: a data set (one process) or a partition folder (one
            rank per part). Its feature width must be the model's.
        nodes: write the nodes of this split only ("all": every node).
        out: the table to write (.parquet or .csv).
        embeddings: also write every node's last hidden layer here (.parquet or .csv).
    """

    model: Path = option(metavar="MODEL", help="a model from `haloflow export`, or a GCN checkpoint")
    dataset: str | None = option(None, metavar="PATH", help="a data set (SNAP, PACE, OGB folder, Planetoid "
                                 "folder): one process")
    partitions: str | None = option(None, metavar="DIR", help="a partition folder from `haloflow partition`, "
                                    "at any --nproc that divides its parts (the same scores at each)")
    dataset_format: str = option("auto", "--format", help="format of --dataset")
    reader_options: tuple[tuple[str, object], ...] = hidden(
        (), why="the reader flags (--num-nodes, --one-based, --name, --split), shared with `haloflow partition`")
    symmetrize: bool = option(True, "--directed", negate=True, help="with --dataset: do not symmetrise the graph "
                              "(give it when the model was trained so)")
    nodes: str = option("all", choices=SPLITS, help="write only the nodes of this split")
    out: Path = option(metavar="FILE", help="where to write one row per node (.parquet or .csv)")
    embeddings: Path | None = option(None, metavar="FILE",
                                     help="also write each node's last hidden layer (.parquet or .csv)")
    device: str = option("auto", choices=DEVICES, means="CUDA when present", help="where each rank computes")
    timeout_s: float = option(120.0, "--timeout", metavar="S", help="seconds a rank waits for a silent peer")
    overwrite: bool = option(False, help="replace a file at --out or --embeddings that predict did not write (one "
                             "it wrote is replaced anyway)")

    def __post_init__(self) -> None:
        if (self.dataset is None) == (self.partitions is None):
            raise ConfigError("give exactly one input: a dataset path (one process) or a partitions folder",
                              field="dataset")
        object.__setattr__(self, "model", Path(self.model))
        if not self.model.exists():
            raise FileNotFoundError(f"model {self.model} does not exist")
        for name in ("dataset", "partitions"):
            value = getattr(self, name)
            if value is not None and not Path(value).exists():
                raise FileNotFoundError(f"{name} {value} does not exist")
        if self.nodes not in SPLITS:
            raise ConfigError(f"nodes must be one of {SPLITS}, got {self.nodes!r}", field="nodes")
        object.__setattr__(self, "out", check_table_path(self.out, "--out", self.overwrite))
        object.__setattr__(self, "embeddings", check_table_path(self.embeddings, "--embeddings", self.overwrite))
        predict_runtime(self.device, self.timeout_s)

    def train_config(self, model: ModelFile) -> GCNTrainConfig:
        """The trainer's config that rebuilds ``model`` on this input (its data path, its distributed model)."""
        m = model.config["model"]
        return GCNTrainConfig(dataset=self.dataset, partitions=self.partitions, dataset_format=self.dataset_format,
                              reader_options=self.reader_options, symmetrize=self.symmetrize,
                              normalize_features=bool(model.config.get("normalize_features", True)),
                              hidden_dim=m["hidden_dim"], num_layers=m["num_layers"], dropout=m["dropout"],
                              conv=m["conv"], seed=m["seed"], precompute_first=m["precompute_first"], epochs=1,
                              runtime=predict_runtime(self.device, self.timeout_s))


def predict_gcn(config: GCNPredictConfig) -> PredictResult:
    """Score every node (see the module docstring); every rank returns the same result, rank 0 writes the files.

    Raises:
        ConfigError: a model of another family, or a graph whose feature width or classes differ from the model's.
    """
    from haloflow.engine.gcn.train import GCNFamily

    model = load_model(config.model)
    model.expect_family("gcn")
    train_config = config.train_config(model)
    fam = GCNFamily(train_config)
    with Runtime.start(train_config.runtime, join=fam.join) as rt:
        fam.setup(rt)
        _check_shape(model, fam.model.config, config)
        fam.model.load_state_dict(dict(model.tensors))
        fam.begin(0)
        lay, local = rt.layout, fam.local
        fam.model.eval()
        fam.agg.set_epoch(max(model.step - 1, 0), False)  # exact halos, no sampling
        with torch.no_grad():
            logits = torch.cat(fam.forward(max(model.step - 1, 0)))  # (n_own, C): the hosted parts' rows
        counts = fam.counts
        labels = local.cat_labels()
        masks = [local.cat_mask(s) for s in range(3)]
        correct = all_gather_rows([float((logits.argmax(1)[m] == labels[m]).sum()) for m in masks],
                                  lay.group, "predicted counts").sum(0)  # whole numbers: exact in any order
        metrics = {"train_acc": float(correct[0]) / counts.train, "val_acc": float(correct[1]) / max(counts.val, 1),
                   "test_acc": float(correct[2]) / max(counts.test, 1)}
        table = _gather_nodes(logits, local, lay.group)
        hidden_rows = _hidden(fam, model) if config.embeddings is not None else None
        if hidden_rows is not None:
            hidden_rows = _gather_matrix(hidden_rows, lay.group)
        order = table.pop("_order")
        keep = _split_rows(table["split"], config.nodes)
        if lay.is_main:
            write_table(config.out, {k: v[keep] for k, v in table.items()})
            if hidden_rows is not None:
                h = hidden_rows[order][keep]  # (rows, hidden) in original-id order
                write_table(config.embeddings, {"node_id": table["node_id"][keep],
                                                **{f"h_{j}": h[:, j] for j in range(h.shape[1])}})
        return PredictResult(family="gcn", rows=int(keep.sum()), metrics=metrics, out=config.out,
                             embeddings=config.embeddings, rank=lay.rank, step=model.step)


def _check_shape(model: ModelFile, built, config: GCNPredictConfig) -> None:
    saved = model.config["model"]
    where = config.dataset or config.partitions
    if saved["in_dim"] != built.in_dim:
        raise ConfigError(f"{where}: {built.in_dim} features per node, but the model {model.source} was trained on "
                          f"{saved['in_dim']}: expected a graph with {saved['in_dim']} features", field="dataset")
    if saved["out_dim"] != built.out_dim:
        raise ConfigError(f"{where}: {built.out_dim} classes, but the model {model.source} predicts "
                          f"{saved['out_dim']}: expected a graph with {saved['out_dim']} classes", field="dataset")


def _gather_matrix(x: torch.Tensor, group) -> np.ndarray:
    """Every rank's rows (n_r, C) in rank order, as one (N, C) array."""
    width = x.shape[1]
    return all_gather_cat(x.detach().float().cpu().reshape(-1), group).numpy().reshape(-1, width)


def _gather_nodes(logits: torch.Tensor, local, group) -> dict[str, np.ndarray]:
    """Every node's row in original-id order (rank 0 writes them): id, split, label, class, probabilities."""
    probs = torch.softmax(logits.double(), dim=1).float()  # (n_own, C)
    labels = local.cat_labels()
    split = torch.zeros(labels.shape[0], dtype=torch.int8)
    for code in (1, 2, 3):
        split[local.cat_mask(code - 1).cpu()] = code
    ids = all_gather_cat(local.cat_ids().cpu(), group).numpy()
    order = np.argsort(ids, kind="stable")
    cols = {"node_id": ids[order],
            "split": np.array(["none", "train", "val", "test"])[all_gather_cat(split, group).numpy()[order]],
            "label": all_gather_cat(labels.cpu(), group).numpy()[order],
            "predicted": all_gather_cat(logits.argmax(1).cpu(), group).numpy()[order]}
    p = _gather_matrix(probs, group)[order]
    cols.update({f"prob_{c}": p[:, c] for c in range(p.shape[1])})
    cols["_order"] = order  # taken out before writing
    return cols


def _split_rows(split: np.ndarray, which: str) -> np.ndarray:
    return np.ones(split.shape[0], dtype=bool) if which == "all" else split == which


def _hidden(fam, model: ModelFile) -> torch.Tensor:
    """relu of layer L-2's output: the first L-1 layers as a GCN of their own, with the model's weights."""
    from haloflow.models.config import GCNConfig
    from haloflow.models.gcn import GCN

    cfg = fam.model.config
    if cfg.num_layers < 2:
        raise ConfigError(f"--embeddings: the model has {cfg.num_layers} layer, so no hidden layer; expected a "
                          "model of 2 layers or more", field="embeddings")
    head_cfg = GCNConfig(**{**asdict(cfg), "out_dim": cfg.hidden_dim, "num_layers": cfg.num_layers - 1})
    local = fam.local
    head = GCN(head_cfg).to(local.xs[0].device)
    own = head.state_dict()
    head.load_state_dict({k: v for k, v in dict(model.tensors).items() if k in own})
    head.eval()
    with torch.no_grad():
        return torch.relu(torch.cat(head.forward_blocks(local.xs, fam.agg, local.node_ids, 0)))  # (n_own, hidden)
