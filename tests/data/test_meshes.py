import numpy as np
import pytest

from haloflow.data.meshes import HOLE_CENTRE, HOLE_RADIUS, delaunay_graph, fe_mesh_graph, fe_mesh_points
from haloflow.errors import ConfigError


@pytest.mark.parametrize("make", [delaunay_graph, fe_mesh_graph])
def test_a_mesh_is_a_planar_symmetric_graph_that_repeats_with_its_seed(make):
    g = make(2000, seed=3)
    assert g.num_nodes == 2000 and g.simple_symmetric
    # a planar triangulation has at most 3N - 6 edges; a Delaunay one of random points has close to that
    assert 2.5 * 2000 <= g.num_edges / 2 <= 3 * 2000 - 6
    assert np.array_equal(g.indices, make(2000, seed=3).indices)
    assert not np.array_equal(g.indices, make(2000, seed=4).indices)


def test_the_fe_mesh_has_a_hole_and_is_denser_at_its_rim():
    points = fe_mesh_points(4000, seed=0)
    r = np.hypot(points[:, 0] - HOLE_CENTRE[0], points[:, 1] - HOLE_CENTRE[1])
    assert r.min() > HOLE_RADIUS
    rim = np.pi * ((HOLE_RADIUS + 0.05) ** 2 - HOLE_RADIUS**2)  # area of the ring just outside the hole
    outer = 4 * 0.1 * 0.1  # the four 0.1 x 0.1 corners of the square
    corners = ((np.minimum(points, 1 - points) < 0.1).all(axis=1)).sum()
    assert (r < HOLE_RADIUS + 0.05).sum() / rim > 2 * corners / outer


def test_too_few_points_is_refused():
    with pytest.raises(ConfigError, match=r"a mesh needs num_nodes >= 3 points, got 2"):
        delaunay_graph(2)
