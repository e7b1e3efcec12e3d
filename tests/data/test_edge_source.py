import gzip

import numpy as np
import pytest

from haloflow.data.edge_source import read_edges
from haloflow.data.streamed import SnapEdges, open_edge_source
from haloflow.data.readers import read_snap
from haloflow.errors import ConfigError, InputFormatError


def _snap_text(rng, n=500, e=4000):
    pairs = rng.integers(0, n, size=(e, 2))
    lines = ["# a comment", "src\tdst\tweight"] + [f"{s}\t{d}\t0.5" for s, d in pairs]
    return "\n".join(lines) + "\n", pairs


@pytest.mark.parametrize("max_edges", [16, 1000, 1 << 20])
def test_snap_chunks_equal_the_whole_file_reader(tmp_path, max_edges):
    text, pairs = _snap_text(np.random.default_rng(1))
    path = tmp_path / "g.txt.gz"
    path.write_bytes(gzip.compress(text.encode()))
    source = SnapEdges(path, progress=False)
    chunks = list(source.chunks(max_edges))
    assert all(s.shape[0] <= max_edges for s, _ in chunks) and (len(chunks) > 1) == (max_edges <= 1000)
    np.testing.assert_array_equal(np.concatenate([s for s, _ in chunks]), pairs[:, 0])
    assert read_edges(SnapEdges(path, progress=False), max_edges=max_edges).equals(read_snap(path))


def test_snap_chunk_errors_carry_the_file_line(tmp_path):
    text, _ = _snap_text(np.random.default_rng(2))
    lines = text.splitlines()
    lines[3000] = "17\tx7\t0.5"
    path = tmp_path / "g.txt"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputFormatError) as whole:
        read_snap(path)
    with pytest.raises(InputFormatError) as chunked:
        list(SnapEdges(path, progress=False).chunks(16))
    assert str(chunked.value) == str(whole.value) and ":3001:" in str(whole.value)


def test_snap_finish_applies_the_plausible_id_bound(tmp_path):
    path = tmp_path / "g.txt"
    path.write_text("0 1\n1 99999\n")
    source = SnapEdges(path, progress=False)
    e = sum(s.size for s, _ in source.chunks(4))
    with pytest.raises(InputFormatError, match=r"g.txt:2: node id 99999 is out of range"):
        source.finish(e, 99999)
    assert SnapEdges(path, num_nodes=100000, progress=False).finish(e, 99999) == 100000


def test_one_based_and_options(tmp_path):
    path = tmp_path / "g.txt"
    path.write_text("1 2\n2 3\n")
    source = open_edge_source(path, one_based=True, progress=False)
    assert [s.tolist() for s, _ in source.chunks(8)] == [[0, 1]] and source.finish(2, 2) == 3
    with pytest.raises(ConfigError, match=r"format 'npy' takes no option 'one_based'"):
        np.save(tmp_path / "e.npy", np.zeros((1, 2), np.int64))
        open_edge_source(tmp_path / "e.npy", one_based=True)
    (tmp_path / "g.mtx").write_text("%%MatrixMarket matrix coordinate pattern general\n2 2 1\n1 2\n")
    with pytest.raises(ConfigError, match=r"format 'mtx' is read whole, not in chunks: expected one of snap, pace"):
        open_edge_source(tmp_path / "g.mtx")
