import gzip
import re

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

from haloflow.data.graph import CSRGraph
from haloflow.data.matrix_market import read_matrix_market
from haloflow.data.readers import detect_format, read_dataset
from haloflow.errors import InputFormatError


def edge_set(graph: CSRGraph) -> set[tuple[int, int]]:
    src, dst = graph.edges()
    return set(zip(src.tolist(), dst.tolist()))


def test_a_general_matrix_written_by_mmwrite_is_its_entries_as_directed_edges(tmp_path):
    # The size line "200 200 1200" is the header, not an edge: 200 nodes (an edge-list reader made it 201).
    matrix = sp.random(200, 200, density=0.03, random_state=0, format="coo")
    path = tmp_path / "a.mtx"
    scipy.io.mmwrite(path, matrix)
    assert path.read_text().splitlines()[2] == "200 200 1200"
    assert detect_format(path) == "mtx"
    ds = read_dataset(path)
    assert ds.name == "a" and ds.num_nodes == 200 and ds.graph.num_edges == 1200
    assert edge_set(ds.graph) == set(zip(matrix.row.tolist(), matrix.col.tolist()))


def test_a_symmetric_pattern_file_is_undirected_with_each_loop_once(tmp_path):
    # One triangle stored, 1-based: 2-1, 3-2, and a self-loop on 4; node 4 has no other edge.
    path = tmp_path / "s.txt.gz"  # told by its banner (not its name), decompressed by its magic bytes
    path.write_bytes(gzip.compress(b"%%MatrixMarket matrix coordinate pattern symmetric\n% by hand\n"
                                   b"4 4 3\n2 1\n3 2\n4 4\n"))
    assert detect_format(path) == "mtx"
    graph = read_dataset(path).graph
    assert graph.num_nodes == 4
    assert sorted(edge_set(graph)) == [(0, 1), (1, 0), (1, 2), (2, 1), (3, 3)]
    assert graph.num_edges == 5


def test_values_are_ignored_and_an_explicit_zero_is_an_edge(tmp_path):
    path = tmp_path / "w.mtx"
    path.write_text("%%MatrixMarket matrix coordinate real general\n3 3 2\n1 2 0.0\n3 1 -2.5e3\n")
    assert edge_set(read_matrix_market(path)) == {(0, 1), (2, 0)}


@pytest.mark.parametrize("text, line, match", [
    ("0 1\n1 2\n", 1, "not a Matrix Market banner: expected '%%MatrixMarket matrix coordinate <field> "
                      "<symmetry>', found '0 1'"),
    ("%%MatrixMarket matrix array real general\n2 2\n1\n2\n3\n4\n", 1, "a dense 'array' matrix: expected the "
                                                                      "sparse 'coordinate' format"),
    ("%%MatrixMarket matrix coordinate real diagonal\n2 2 1\n1 1 1\n", 1, "unknown Matrix Market banner"),
    ("%%MatrixMarket matrix coordinate real general\n% c\n3 4 1\n1 2 1\n", 3, "a 3 x 4 matrix: expected a square"),
    ("%%MatrixMarket matrix coordinate real general\n3 3\n", 2, "bad size line: expected 'rows cols entries'"),
    ("%%MatrixMarket matrix coordinate real general\n3 3 2\n1 2 1\n4 1 1\n", 4, "row index out of bounds "
                                                                               r"\(scipy.io.mmread\): expected"),
    ("%%MatrixMarket matrix coordinate real general\n3 3 2\n1 2 x\n2 1 1\n", 3, "invalid floating-point value"),
    ("%%MatrixMarket matrix coordinate real general\n3 3 3\n1 2 1\n", None, "truncated file; expected another"),
    ("%%MatrixMarket matrix coordinate real general\n0 0 0\n", 2, "empty graph: the size line says a 0 x 0"),
    ("%%MatrixMarket matrix coordinate real general\n3 3 10000000000000\n1 2 1\n", 2,
     "the size line says 10,000,000,000,000 entries, which need .* to read, but this machine has .* free"),
])
def test_bad_content_is_one_error_naming_file_and_line(tmp_path, text, line, match):
    path = tmp_path / "bad.mtx"
    path.write_text(text)
    where = re.escape(f"{path}:{line}: " if line is not None else f"{path}: ")
    with pytest.raises(InputFormatError, match=where + match) as caught:
        read_dataset(path)
    assert "\n" not in str(caught.value)


def test_an_edge_list_named_mtx_is_refused_not_read_as_edges(tmp_path):
    path = tmp_path / "edges.mtx"
    path.write_text("200 200 1200\n0 1\n")
    with pytest.raises(InputFormatError, match="not a Matrix Market banner"):
        read_dataset(path)
