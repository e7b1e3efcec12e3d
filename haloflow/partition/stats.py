"""Quality of a partition: edge cut, halo sizes (communication volume) and balance on each weight.

::

    part   inner   halo   halo/inner   in-edges   train
       0   1,000    120         0.12      9,800      70
       1   1,010     95         0.09     10,150      71
    edge cut = cut edges / all edges          total halo = 215 rows sent per exchange
    balance[w] = max over parts / mean over parts   (1.0 = perfect)   w in nodes, edges, train
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from haloflow.data.graph import CSRGraph
from haloflow.errors import ConfigError
from haloflow.partition.halo import HaloIndex
from haloflow.utils.table import format_table

if TYPE_CHECKING:
    from haloflow.partition.relabel import Relabelling

__all__ = ["PartitionStats", "partition_stats", "format_stats"]


def _balance(per_part: np.ndarray) -> float:
    mean = float(per_part.mean()) if per_part.size else 0.0
    return float(per_part.max()) / mean if mean > 0 else 1.0


@dataclass(frozen=True, kw_only=True)
class PartitionStats:
    """Per-part counts and the derived quality figures.

    Shapes:
        inner, halo, in_edges: int64 (K,);  train: int64 (K,) or None when the data set has no train mask.
    """

    num_nodes: int
    num_edges: int
    cut_edges: int
    inner: np.ndarray
    halo: np.ndarray
    in_edges: np.ndarray
    train: np.ndarray | None = None

    def __post_init__(self) -> None:
        k = self.inner.shape[0]
        for name in ("halo", "in_edges", "train"):
            arr = getattr(self, name)
            if arr is not None and arr.shape != (k,):
                raise ConfigError(f"PartitionStats.{name} must have shape ({k},) like inner, got {arr.shape}")
        if not 0 <= self.cut_edges <= self.num_edges:
            raise ConfigError(f"cut_edges must be in [0, num_edges={self.num_edges}], got {self.cut_edges}")

    @property
    def num_parts(self) -> int:
        return int(self.inner.shape[0])

    @property
    def edge_cut(self) -> float:
        """Fraction of edges whose endpoints lie in different parts (0 for an edgeless graph)."""
        return self.cut_edges / self.num_edges if self.num_edges else 0.0

    @property
    def halo_ratio(self) -> np.ndarray:
        """float64 (K,) halo / inner per part (0 where a part is empty)."""
        return np.divide(self.halo, self.inner, out=np.zeros(self.num_parts), where=self.inner > 0)

    @property
    def total_halo(self) -> int:
        """Rows received by all parts in one halo exchange: the communication volume."""
        return int(self.halo.sum())

    @property
    def balance(self) -> dict[str, float]:
        """Largest / mean per part, for nodes, edges (in-edges) and, when known, train nodes."""
        out = {"nodes": _balance(self.inner), "edges": _balance(self.in_edges)}
        if self.train is not None:
            out["train"] = _balance(self.train)
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (lists and numbers), including the derived figures for readers of meta.json."""
        return {
            "num_nodes": self.num_nodes,
            "num_edges": self.num_edges,
            "cut_edges": self.cut_edges,
            "edge_cut": self.edge_cut,
            "total_halo": self.total_halo,
            "balance": self.balance,
            "inner": self.inner.tolist(),
            "halo": self.halo.tolist(),
            "in_edges": self.in_edges.tolist(),
            "train": None if self.train is None else self.train.tolist(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PartitionStats":
        train = d.get("train")
        return cls(
            num_nodes=int(d["num_nodes"]),
            num_edges=int(d["num_edges"]),
            cut_edges=int(d["cut_edges"]),
            inner=np.asarray(d["inner"], dtype=np.int64),
            halo=np.asarray(d["halo"], dtype=np.int64),
            in_edges=np.asarray(d["in_edges"], dtype=np.int64),
            train=None if train is None else np.asarray(train, dtype=np.int64),
        )


def partition_stats(
    graph: CSRGraph,
    relabelling: "Relabelling",
    *,
    train_mask: np.ndarray | None = None,
    index: HaloIndex | None = None,
) -> PartitionStats:
    """Statistics of ``relabelling``'s partition of ``graph`` (ORIGINAL ids).

    Args:
        graph: the whole graph.
        relabelling: partition book plus id maps.
        train_mask: bool (N,) over original ids; adds per-part train counts and their balance.
        index: the `HaloIndex` if already built (the halo builder needs it too), else it is built here.
    """
    if index is None:
        index = HaloIndex.build(graph, relabelling)
    train = None
    if train_mask is not None:
        if train_mask.shape != (graph.num_nodes,):
            raise ConfigError(f"train_mask must have shape ({graph.num_nodes},), got {train_mask.shape}")
        in_new = np.asarray(train_mask, dtype=bool)[relabelling.new_to_orig]  # (N,) by new id
        csum = np.concatenate([[0], np.cumsum(in_new, dtype=np.int64)])  # (N+1,)
        bounds = relabelling.book.bounds
        train = csum[bounds[1:]] - csum[bounds[:-1]]  # (K,)
    return PartitionStats(
        num_nodes=graph.num_nodes,
        num_edges=graph.num_edges,
        cut_edges=index.cut_edges,
        inner=relabelling.book.part_sizes().astype(np.int64),
        halo=index.halo_sizes().astype(np.int64),
        in_edges=index.in_edges,
        train=train,
    )


def format_stats(stats: PartitionStats) -> str:
    """The per-part table plus the edge-cut and balance lines, as the CLI prints them."""
    headers = ["part", "inner", "halo", "halo/inner", "edges"] + (["train"] if stats.train is not None else [])
    rows = []
    for k in range(stats.num_parts):
        row = [k, int(stats.inner[k]), int(stats.halo[k]), float(stats.halo_ratio[k]), int(stats.in_edges[k])]
        rows.append(row + ([int(stats.train[k])] if stats.train is not None else []))
    inner_total = int(stats.inner.sum())
    total = ["total", inner_total, stats.total_halo, stats.total_halo / inner_total if inner_total else 0.0,
             int(stats.in_edges.sum())]
    rows.append(total + ([int(stats.train.sum())] if stats.train is not None else []))
    balance = ", ".join(f"{name} {value:.3f}" for name, value in stats.balance.items())
    return "\n".join([
        format_table(headers, rows),
        f"edge cut: {stats.edge_cut:.2%} ({stats.cut_edges:,} of {stats.num_edges:,} edges cross parts)",
        f"balance (largest / mean part): {balance}",
    ])
