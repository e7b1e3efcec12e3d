import gzip

import numpy as np
import pytest

from haloflow.partition.estimate import estimate_in_memory, estimate_out_of_core, input_edges
from haloflow.partition.ooc.budget import SLACK


def test_binary_and_metis_inputs_state_their_edge_count_in_their_header(tmp_path):
    np.save(tmp_path / "e.npy", np.zeros((1234, 2), dtype=np.int32))
    assert input_edges(tmp_path / "e.npy", "npy") == (1234, "from the .npy header")
    np.save(tmp_path / "t.npy", np.zeros((2, 77), dtype=np.int64))  # the (2, E) layout
    assert input_edges(tmp_path / "t.npy", "npy")[0] == 77
    (tmp_path / "g.graph").write_text("% a comment\n3 2\n2\n1 3\n2\n")
    assert input_edges(tmp_path / "g.graph", "metis") == (2, "from the METIS header")


def test_a_text_file_is_estimated_from_a_sample_of_its_lines(tmp_path):
    rng = np.random.default_rng(0)
    pairs = rng.integers(0, 10**6, (200_000, 2))
    text = "".join(f"{a}\t{b}\n" for a, b in pairs).encode()
    (tmp_path / "g.txt").write_bytes(text)
    (tmp_path / "g.txt.gz").write_bytes(gzip.compress(text))
    for name in ("g.txt", "g.txt.gz"):  # over 1 MiB: sampled, and scaled by the compression ratio
        edges, basis = input_edges(tmp_path / name, "snap")
        assert abs(edges / 200_000 - 1) < 0.15 and "first MiB" in basis, (name, edges)


def test_what_cannot_be_estimated_says_so_and_never_raises(tmp_path):
    (tmp_path / "bad.txt.gz").write_bytes(gzip.compress(b"1 2\n" * 1000)[:40])  # truncated
    assert estimate_in_memory(tmp_path / "bad.txt.gz", "snap", "metis").line().startswith(
        "estimate before reading: unknown")
    assert "unknown" in estimate_in_memory(tmp_path, "ogb", "metis").line()


@pytest.mark.parametrize("budget", [256 << 20, 1 << 30])
def test_out_of_core_estimate_is_the_budget_the_chunks_fill_or_less(tmp_path, budget):
    np.save(tmp_path / "big.npy", np.zeros((1, 2), dtype=np.int64))
    small = estimate_out_of_core(tmp_path / "big.npy", "npy", budget)
    big = np.lib.format.open_memmap(tmp_path / "huge.npy", mode="w+", dtype=np.int64, shape=(10**8, 2))
    del big  # a sparse file: only its header is read
    large = estimate_out_of_core(tmp_path / "huge.npy", "npy", budget)
    assert small.peak_bytes < large.peak_bytes == int(budget * (1 - SLACK))
    assert large.temp_bytes > 16 * 10**8
