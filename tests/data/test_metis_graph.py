import numpy as np
import pytest

from haloflow.data.graph import CSRGraph
from haloflow.data.metis_graph import MetisEdges, read_metis
from haloflow.data.readers import detect_format, read_dataset, read_pace
from haloflow.errors import InputFormatError

# The METIS manual's style: a 4-cycle with a chord, vertex 4 listed last; comments anywhere.
PLAIN = "% a comment\n4 5\n2 3\n1 3 4\n% between vertices\n1 2 4\n2 3\n"
EDGES = [(1, 2), (1, 3), (2, 3), (2, 4), (3, 4)]  # 1-based undirected


def _expected(n=4, edges=EDGES):
    e = np.array(edges) - 1
    return CSRGraph.from_edges(e[:, 0], e[:, 1], n, symmetrize=True)


def test_plain_file_equals_the_same_graph_as_pace(tmp_path):
    (tmp_path / "g.graph").write_text(PLAIN)
    (tmp_path / "g.gr").write_text("p tw 4 5\n" + "".join(f"{u} {v}\n" for u, v in EDGES))
    graph = read_metis(tmp_path / "g.graph")
    assert graph.equals(_expected()) and graph.equals(read_pace(tmp_path / "g.gr")) and graph.symmetric
    assert detect_format(tmp_path / "g.graph") == "metis" and read_dataset(tmp_path / "g.graph").graph.equals(graph)


def test_blank_lines_are_vertices_without_neighbours(tmp_path):
    (tmp_path / "g.graph").write_text("5 2\n\n3\n2\n\n5\n4\n\n\n")  # one blank too many in the middle
    with pytest.raises(InputFormatError, match=r"g.graph:7: more than n = 5 vertex lines .* found '4'"):
        read_metis(tmp_path / "g.graph")
    (tmp_path / "g.graph").write_text("5 2\n\n3\n2\n5\n4\n\n\n")
    assert read_metis(tmp_path / "g.graph").equals(_expected(5, [(2, 3), (4, 5)]))


def test_weights_are_read_past(tmp_path):
    # fmt 111 with ncon 2: size, two vertex weights, then (neighbour, edge weight) pairs
    lines = ["4 5 111 2", "9 1 1 2 7 3 7", "9 1 1 1 7 3 7 4 7", "9 1 1 1 7 2 7 4 7", "9 1 1 2 7 3 7"]
    (tmp_path / "w.graph").write_text("\n".join(lines) + "\n")
    assert read_metis(tmp_path / "w.graph").equals(_expected())
    (tmp_path / "e.graph").write_text("4 5 1\n2 5 3 5\n1 5 3 5 4 5\n1 5 2 5 4 5\n2 5 3 5\n")
    assert read_metis(tmp_path / "e.graph").equals(_expected())


@pytest.mark.parametrize("text, message", [
    ("4 5\n2 3\n1 3 4\n1 2 4\n2 9\n", r"g.graph:5: neighbour id 9 is out of range: ids are 1-based, expected 1..4"),
    ("4 5\n2 3\n1 3 4\n1 2 4\n2 3\n1\n", r"g.graph:6: more than n = 4 vertex lines"),
    ("4 6\n2 3\n1 3 4\n1 2 4\n2 3\n", r"g.graph:1: the header says m = 6 edges, so 2m = 12 neighbour entries .* 10"),
    ("5 5\n2 3\n1 3 4\n1 2 4\n2 3", r"g.graph:1: the header says n = 5 vertices but the file has 4 vertex lines"),
    ("4 5 1\n2 3 1\n1 3 4\n", r"g.graph:2: vertex 1: expected each neighbour followed by its edge weight"),
    ("4 5 2\n", r"g.graph:1: bad header: fmt '2' must be up to three 0/1 digits"),
    ("4 x\n", r"g.graph:1: bad header: expected a header 'n m \[fmt \[ncon\]\]'"),
    ("% only a comment\n", r"g.graph: missing header"),
    ("4 5\n2 3\n1 x 4\n", r"g.graph:3: non-integer token 'x'"),
])
def test_errors_name_the_line(tmp_path, text, message):
    (tmp_path / "g.graph").write_text(text)
    with pytest.raises(InputFormatError, match=message):
        read_metis(tmp_path / "g.graph")


def test_streamed_in_small_blocks_equals_in_memory(tmp_path):
    rng = np.random.default_rng(3)
    n = 300
    e = rng.integers(0, n, size=(2000, 2))
    e = e[e[:, 0] != e[:, 1]]
    graph = CSRGraph.from_edges(e[:, 0], e[:, 1], n, symmetrize=True)
    lines = [f"{n} {graph.num_edges // 2}"]
    for v in range(n):
        lines.append(" ".join(str(u + 1) for u in graph.indices[graph.indptr[v]:graph.indptr[v + 1]]))
    (tmp_path / "r.graph").write_text("\n".join(lines) + "\n")
    assert read_metis(tmp_path / "r.graph").equals(graph)
    source = MetisEdges(tmp_path / "r.graph", progress=False)
    chunks = list(source.chunks(64))  # blocks of 128 bytes: many chunks
    assert len(chunks) > 10 and source.finish(sum(s.size for s, _ in chunks), n - 1) == n
    assert read_metis(tmp_path / "r.graph", block_bytes=97).equals(graph)  # blocks of a few lines each
