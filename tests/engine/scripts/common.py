"""Inputs shared by the torchrun scripts and the tests that check their output (same seed, same arrays)."""

from __future__ import annotations

import numpy as np

from haloflow.data.graph import CSRGraph, GraphDataset
from haloflow.partition.halo import build_part
from haloflow.partition.metis import metis_partition, symmetric_adjacency
from haloflow.partition.random import random_partition
from haloflow.partition.relabel import relabel
from haloflow.partition.types import Assignment, GraphPart


def small_dataset(num_nodes: int = 60, num_edges: int = 200, feat_dim: int = 6, num_classes: int = 3,
                  seed: int = 0) -> GraphDataset:
    """A directed random graph (some nodes without in-edges) with features, labels and split masks."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, num_nodes, num_edges)
    dst = rng.integers(0, num_nodes - 3, num_edges)  # the last 3 nodes have no in-edges
    graph = CSRGraph.from_edges(src, dst, num_nodes, drop_self_loops=True, dedup=True)
    split = rng.integers(0, 3, num_nodes)
    return GraphDataset(
        graph=graph,
        features=rng.standard_normal((num_nodes, feat_dim)).astype(np.float32),
        labels=rng.integers(0, num_classes, num_nodes).astype(np.int64),
        train_mask=split == 0, val_mask=split == 1, test_mask=split == 2, num_classes=num_classes, name="small",
    )


def assignment(graph: CSRGraph, num_parts: int, method: str, seed: int = 0) -> Assignment:
    if method == "random":
        parts = random_partition(graph.num_nodes, num_parts, seed=seed)
    elif method == "metis":
        xadj, adjncy = symmetric_adjacency(graph.indptr, graph.indices, graph.num_nodes)
        parts = metis_partition(xadj, adjncy, num_parts, seed=seed)
    else:
        raise ValueError(method)
    return Assignment(parts=parts, num_parts=num_parts, method=method, seed=seed)


def parts_of(dataset: GraphDataset, num_parts: int, method: str = "random", seed: int = 0) -> list[GraphPart]:
    relabelling = relabel(assignment(dataset.graph, num_parts, method, seed))
    return [build_part(dataset.graph, relabelling, k, dataset) for k in range(num_parts)]
