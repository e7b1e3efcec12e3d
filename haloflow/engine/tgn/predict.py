"""TGN after training: its export (``export_tensors``) and `predict_tgn`, a score per event of the stream.

::

    export    the single-device TGN's state dict, and every node's memory and mailbox rows by global id
              (node_memory.<field>, N rows each): the stream's past up to the end of training
    predict   TGNFamily.setup on --events (node memory by --partitions, or blocks of ids, at this K), the
              model's weights and memory rows, then the trainer's own evaluation (evaluate_stream): the memory
              follows the stream from the end of training through validation and test, each event scored
              against its fixed negative -> event, src, dst, t, split, score, negative_score; AP and AUC
    --embeddings  every node's memory as the stream left it (gathered from its owner)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from haloflow.engine.export import ModelFile, RowBlocks, WholeRows, load_model
from haloflow.engine.predict import PredictResult, check_table_path, predict_runtime, write_table
from haloflow.engine.run_config import DEVICES
from haloflow.engine.runtime import Runtime
from haloflow.errors import ConfigError
from haloflow.utils.config_flags import option

__all__ = ["TGNPredictConfig", "predict_tgn", "export_tensors", "MEMORY_PREFIX"]

MEMORY_PREFIX = "node_memory."
SPLITS = ("all", "val", "test")


def export_tensors(loaded) -> tuple[dict, dict[str, torch.Tensor | RowBlocks]]:
    """The checkpoint's identity and the single-device TGN's tensors, plus every node's memory rows."""
    from haloflow.engine.tgn.checkpoint import MEMORY_FIELDS

    identity = dict(loaded.manifest["identity"])
    n = int(identity["nodes"])
    tensors: dict[str, torch.Tensor | RowBlocks] = dict(loaded.state["model"])
    for name in MEMORY_FIELDS:
        probe = loaded.rows_at(0, torch.arange(min(n, 1)), name)  # (1, ...): shape and dtype of a row
        tensors[MEMORY_PREFIX + name] = RowBlocks(
            (n, *probe.shape[1:]), probe.dtype,
            lambda lo, hi, name=name: loaded.rows_at(0, torch.arange(lo, hi), name))
    return identity, tensors


@dataclass(frozen=True, kw_only=True)
class TGNPredictConfig:
    """``haloflow predict tgn``: a link score per event of the validation and test parts of a stream.

    Args:
        model: an export (``haloflow export``) or a checkpoint of a TGN run.
        events: the event stream the model was trained on (a JODIE CSV or a SNAP temporal edge list); its nodes
            must be the model's.
        partitions: where node memory lives (as in training; default: contiguous blocks of node ids).
        split: write the events of this part ("all": validation and test). The memory walks both either way.
        out: the table to write (.parquet or .csv).
        embeddings: also write every node's memory as the stream left it.
    """

    model: Path = option(metavar="MODEL", help="a model from `haloflow export`, or a TGN checkpoint")
    events: Path = option(metavar="FILE", help="the event stream: JODIE CSV or SNAP temporal edge list")
    partitions: Path | None = option(None, metavar="DIR", means="contiguous blocks of node ids",
                                     help="`haloflow partition` folder of the stream: node memory lives with its "
                                     "part")
    split: str = option("all", "--events-of", choices=SPLITS, help="write the events of this part of the stream")
    out: Path = option(metavar="FILE", help="where to write one row per event (.parquet or .csv)")
    embeddings: Path | None = option(None, metavar="FILE",
                                     help="also write every node's memory (.parquet or .csv)")
    device: str = option("auto", choices=DEVICES, means="CUDA when present", help="where each rank computes")
    timeout_s: float = option(120.0, "--timeout", metavar="S", help="seconds a rank waits for a silent peer")
    overwrite: bool = option(False, help="replace a file at --out or --embeddings that predict did not write (one "
                             "it wrote is replaced anyway)")

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", Path(self.model))
        object.__setattr__(self, "events", Path(self.events))
        if not self.model.exists():
            raise FileNotFoundError(f"model {self.model} does not exist")
        if not self.events.is_file():
            raise FileNotFoundError(f"event stream {self.events} does not exist")
        if self.partitions is not None:
            object.__setattr__(self, "partitions", Path(self.partitions))
        if self.split not in SPLITS:
            raise ConfigError(f"split must be one of {SPLITS}, got {self.split!r}", field="split")
        object.__setattr__(self, "out", check_table_path(self.out, "--out", self.overwrite))
        object.__setattr__(self, "embeddings", check_table_path(self.embeddings, "--embeddings", self.overwrite))
        predict_runtime(self.device, self.timeout_s)

    def train_config(self, model: ModelFile):
        from haloflow.engine.tgn.config import TGNTrainConfig

        m, c = model.config["model"], model.config
        # the trainer's V (its scores' bits depend on it, not on K); a --partitions folder sets its own
        v = c.get("logical_workers")
        v = int(v) if isinstance(v, int) and self.partitions is None else None
        return TGNTrainConfig(events=self.events, partitions=self.partitions, batch_size=int(c["batch_size"]),
                              logical_workers=v,
                              memory_dim=m["memory_dim"], time_dim=m["time_dim"], embedding_dim=m["embedding_dim"],
                              num_neighbors=m["num_neighbors"], seed=m["seed"], mrr_negatives=0,
                              inductive_fraction=float(c["inductive_fraction"]),
                              runtime=predict_runtime(self.device, self.timeout_s))


def predict_tgn(config: TGNPredictConfig) -> PredictResult:
    """Score the stream's validation and test events (see the module docstring); every rank returns the same
    result, rank 0 writes the files.

    Raises:
        ConfigError: a model of another family, or a stream with nodes or edge features the model does not know.
    """
    from haloflow.engine.tgn.checkpoint import MEMORY_FIELDS, load_memory
    from haloflow.engine.tgn.train import TGNFamily, evaluate_stream, read_events

    model = load_model(config.model)
    model.expect_family("tgn")
    events = _events_for(model, read_events(config.events), config.events)
    train_config = config.train_config(model)
    fam = TGNFamily(train_config, events=events)
    with Runtime.start(train_config.runtime, join=True) as rt:
        fam.setup(rt)
        fam.model.load_state_dict({k: v for k, v in model.tensors.items() if not k.startswith(MEMORY_PREFIX)})
        load_memory(fam.memory, WholeRows(model.source, {(0, f): model.tensors[MEMORY_PREFIX + f]
                                                         for f in MEMORY_FIELDS}), rt.layout.rank)
        scores: dict = {}
        metrics = evaluate_stream(fam, scores)
        memory = fam.memory.gather_all() if config.embeddings is not None else None  # a collective
        parts = ("val", "test") if config.split == "all" else (config.split,)
        rows = sum(scores[p][0].shape[0] for p in parts)
        if rt.layout.is_main:
            eids = np.concatenate([scores[p][0] for p in parts])
            write_table(config.out, {
                "event": eids, "src": events.src[eids], "dst": events.dst[eids], "t": events.t[eids],
                "split": np.concatenate([np.full(scores[p][0].shape[0], p) for p in parts]),
                "score": _sigmoid(np.concatenate([scores[p][1] for p in parts])),
                "negative_score": _sigmoid(np.concatenate([scores[p][2] for p in parts]))})
            if memory is not None:
                mem = _memory_matrix(memory)
                write_table(config.embeddings, {"node_id": np.arange(mem.shape[0], dtype=np.int64),
                                                **{f"m_{j}": mem[:, j] for j in range(mem.shape[1])}})
        return PredictResult(family="tgn", rows=rows, metrics=metrics, out=config.out,
                             embeddings=config.embeddings, rank=rt.layout.rank, step=model.step)


def _events_for(model: ModelFile, events, path: Path):
    """The stream checked against the model: no node beyond the model's memory, the same edge-feature width;
    a stream whose highest id is lower is widened to the model's node count (its memory rows exist)."""
    known = int(model.config["nodes"])
    if events.num_nodes > known:
        ids = np.concatenate([events.src, events.dst])
        unknown = np.unique(ids[ids >= known])
        raise ConfigError(f"{path}: {unknown.size} node ids the model {model.source} has no memory for (first "
                          f"{unknown[:3].tolist()}; it knows nodes 0 .. {known - 1}): expected the stream the model "
                          "was trained on", field="events")
    want = int(model.config["model"]["edge_feat_dim"])
    if events.edge_dim != want:
        raise ConfigError(f"{path}: {events.edge_dim} edge features per event, but the model {model.source} takes "
                          f"{want}", field="events")
    return events if events.num_nodes == known else replace(events, num_nodes=known)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(np.float32)


def _memory_matrix(memory) -> np.ndarray:
    return memory.memory.detach().float().cpu().numpy()
