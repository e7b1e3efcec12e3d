"""Mesh-like graphs for partitioner benchmarks: the Delaunay triangulation of random points, and a graded
finite-element-like mesh with a hole (the kind of graph in Walshaw's archive, e.g. ``4elt``: 15,606 nodes).

::

    delaunay_graph(n)      n points uniform in the unit square -> scipy.spatial.Delaunay -> triangle edges
    fe_mesh_graph(n)       n points in the unit square, denser towards a circular hole at (0.5, 0.5) (radius 0.15),
                           none inside it -> Delaunay -> triangles whose centroid lies in the hole removed -> edges

Both return the undirected graph as a symmetric, loop-free CSR (``CSRGraph.simple_symmetric``), mean degree
just under 6, as METIS and every partitioner here expect. Deterministic in ``seed``.
"""

from __future__ import annotations

import numpy as np

from haloflow.data.graph import CSRGraph
from haloflow.errors import ConfigError

__all__ = ["delaunay_graph", "fe_mesh_graph", "fe_mesh_points"]

HOLE_CENTRE = (0.5, 0.5)
HOLE_RADIUS = 0.15


def delaunay_graph(num_nodes: int, *, seed: int = 0) -> CSRGraph:
    """The Delaunay triangulation of ``num_nodes`` uniform random points in the unit square."""
    _check(num_nodes)
    points = np.random.default_rng(seed).random((num_nodes, 2))  # (N, 2)
    return _triangulation(points, None)


def fe_mesh_graph(num_nodes: int, *, seed: int = 0) -> CSRGraph:
    """A graded mesh around a circular hole: point density grows ~4x towards the hole's rim, as a finite-element
    mesh is refined where the solution varies (an airfoil's surface in ``4elt``)."""
    return _triangulation(fe_mesh_points(num_nodes, seed=seed), HOLE_RADIUS)


def fe_mesh_points(num_nodes: int, *, seed: int = 0) -> np.ndarray:
    """float64 (N, 2) the points of :func:`fe_mesh_graph` (node v at row v)."""
    _check(num_nodes)
    rng = np.random.default_rng(seed)
    kept = np.empty((0, 2))
    while kept.shape[0] < num_nodes:  # rejection sampling: accept with probability falling off from the rim
        cand = rng.random((2 * num_nodes, 2))  # (2N, 2)
        r = np.hypot(cand[:, 0] - HOLE_CENTRE[0], cand[:, 1] - HOLE_CENTRE[1])
        accept = (r > HOLE_RADIUS) & (rng.random(cand.shape[0]) < 0.25 + 0.75 * np.exp(-(r - HOLE_RADIUS) / 0.1))
        kept = np.concatenate([kept, cand[accept]])
    return kept[:num_nodes]


def _check(num_nodes: int) -> None:
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, (int, np.integer)) or num_nodes < 3:
        raise ConfigError(f"a mesh needs num_nodes >= 3 points, got {num_nodes!r}")


def _triangulation(points: np.ndarray, hole: float | None) -> CSRGraph:
    from scipy.spatial import Delaunay

    tri = Delaunay(points).simplices  # (T, 3) vertex ids of each triangle
    if hole is not None:
        centroid = points[tri].mean(axis=1)  # (T, 2)
        tri = tri[np.hypot(centroid[:, 0] - HOLE_CENTRE[0], centroid[:, 1] - HOLE_CENTRE[1]) > hole]
    src = np.concatenate([tri[:, 0], tri[:, 1], tri[:, 2]]).astype(np.int64)  # (3T,) each triangle's 3 sides
    dst = np.concatenate([tri[:, 1], tri[:, 2], tri[:, 0]]).astype(np.int64)
    return CSRGraph.from_edges(src, dst, points.shape[0], symmetrize=True, drop_self_loops=True, dedup=True)
