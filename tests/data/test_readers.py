import bz2
import gzip
import lzma
import re

import numpy as np
import pytest

from haloflow.data.graph import CSRGraph, GraphDataset
from haloflow.data.readers import FORMATS, detect_format, read_dataset, read_pace, read_snap
from haloflow.errors import ConfigError, InputFormatError

COMPRESS = {"plain": lambda b: b, "gz": gzip.compress, "xz": lzma.compress, "bz2": bz2.compress}


def write(path, text: str, how: str = "plain"):
    path.write_bytes(COMPRESS[how](text.encode()))
    return path


def expect_error(path, line, match):
    """pytest.raises for an InputFormatError at ``path:line`` whose message matches ``match``."""
    where = re.escape(f"{path}:{line}: ") if line is not None else re.escape(f"{path}: ")
    return pytest.raises(InputFormatError, match=where + ".*" + match)


# --------------------------------------------------------------------------------------------- SNAP
# Every quirk at once: comments at the top and in the middle, tabs, runs of spaces, commas, CRLF, a self-loop,
# a duplicate edge, a blank line in the middle and a trailing blank line.
SNAP_TEXT = (
    "# Directed graph: quirks.txt\r\n"
    "# FromNodeId\tToNodeId\r\n"
    "0\t1\r\n"
    "2   1\r\n"
    "# a comment in the middle\r\n"
    "1,2\r\n"
    "\r\n"
    "  3 \t 3\r\n"
    "0\t1\r\n"
    "\r\n"
)
SNAP_SRC, SNAP_DST = [0, 2, 1, 3, 0], [1, 1, 2, 3, 1]


@pytest.mark.parametrize("how", list(COMPRESS))
def test_read_snap_every_quirk_and_compression(tmp_path, how):
    # The suffix says nothing about the compression: it is recognised by the magic bytes.
    path = write(tmp_path / "quirks.txt", SNAP_TEXT, how)
    g = read_snap(path)
    assert g.num_nodes == 4
    np.testing.assert_array_equal(g.indptr, [0, 0, 3, 4, 5])  # in-neighbours: 1 <- {0, 0, 2}, 2 <- {1}, 3 <- {3}
    np.testing.assert_array_equal(g.indices, [0, 0, 2, 1, 3])
    assert g.equals(CSRGraph.from_edges(SNAP_SRC, SNAP_DST))


def test_read_snap_without_final_newline_and_lf_endings(tmp_path):
    g = read_snap(write(tmp_path / "e.txt", "5 6\n6 5"))
    assert g.num_nodes == 7 and g.num_edges == 2


def test_read_snap_num_nodes_adds_isolated_nodes_and_bounds_ids(tmp_path):
    path = write(tmp_path / "e.txt", "0 1\n1 2\n")
    g = read_snap(path, num_nodes=6)
    assert g.num_nodes == 6 and g.num_edges == 2
    with expect_error(path, 2, r"node id 2 is out of range: expected node ids in \[0, 2\)"):
        read_snap(path, num_nodes=2)
    empty = write(tmp_path / "empty.txt", "# nothing\n")
    assert read_snap(empty, num_nodes=3).num_edges == 0  # nodes but no edges is a graph


@pytest.mark.parametrize(
    "text, line, match",
    [
        ("0 1\n# ok\n1 2 3\n", 3,
         r"expected 2 fields \(src dst\) separated by tabs, spaces or commas, found 3: '1 2 3'"),
        ("0 1\n7\n", 2, "expected 2 fields .* found 1: '7'"),
        ("0 1\n1 1.5\n", 2, r"non-integer token '1\.5': expected an integer node id"),
        ("0 1\r\nsrc dst\r\n", 2, "non-integer token 'src'"),
        ("0 1\n2 -3\n", 2, "negative node id -3: expected node ids >= 0"),
        ("0 12345678901234567890\n", 1, "more than 18 digits"),
        ("# only\n# comments\n\n", None, "empty graph: no edge lines and no num_nodes"),
        ("", None, "empty graph"),
    ],
)
def test_read_snap_errors_name_file_line_found_and_expected(tmp_path, text, line, match):
    path = write(tmp_path / "bad.txt.gz", text, "gz")
    with expect_error(path, line, match) as info:
        read_snap(path)
    assert info.value.line == line


def test_read_snap_header_comments_and_ignored_columns(tmp_path, caplog):
    # KONECT-style '%' comments, a CSV header naming a weight, weights that are not integers.
    path = write(tmp_path / "w.csv", "% sym weighted\nsource,target,weight\n0,1,0.5\n# c\n1,2,-3\n2,0,1e9\n")
    g = read_snap(path)
    assert g.equals(CSRGraph.from_edges([0, 1, 2], [1, 2, 0]))
    assert "ignored a field of every edge line (weight)" in caplog.text
    caplog.clear()
    temporal = write(tmp_path / "t.txt", "src\tdst\tts\n0\t1\t1217567877\n1\t0\t1217567878\n", "gz")
    assert read_snap(temporal).equals(CSRGraph.from_edges([0, 1], [1, 0]))
    assert "(ts)" in caplog.text
    caplog.clear()
    four = write(tmp_path / "f.txt", "0 1 5 1217567877\n1 2 -1 1217567878\n")
    assert read_snap(four).num_edges == 2 and "column 3, column 4" in caplog.text
    with expect_error(four, 1, r"expected 2 to 4 fields \(src dst, then ignored ones\) .* found 5"):
        read_snap(write(tmp_path / "f.txt", "0 1 5 6 7\n"))


def test_read_snap_one_based(tmp_path, caplog):
    path = write(tmp_path / "one.txt", "1 2\n2 3\n3 1\n")
    g = read_snap(path)  # as 0-based: node 0 isolated, and a warning says so
    assert g.num_nodes == 4
    assert "node id 0 never appears (the smallest id is 1)" in caplog.text and "--one-based" in caplog.text
    caplog.clear()
    assert read_snap(path, one_based=True).equals(CSRGraph.from_edges([0, 1, 2], [1, 2, 0]))
    assert read_snap(path, one_based=True, num_nodes=5).num_nodes == 5
    assert read_dataset(path, one_based=True).num_nodes == 3
    assert "never appears" not in caplog.text
    with expect_error(path, 2, r"node id 3 is out of range: expected node ids in 1\.\.2 .*--one-based"):
        read_snap(path, one_based=True, num_nodes=2)
    zero = write(tmp_path / "zero.txt", "1 2\n0 1\n")
    with expect_error(zero, 2, "node id 0 is out of range: expected node ids >= 1"):
        read_snap(zero, one_based=True)


@pytest.mark.parametrize(
    "text, line, bound",
    [("0 1\n1 9999999999\n", 2, 1028), ("0 1\n1 2\n2 5000000\n", 3, 1030)],
)
def test_read_snap_refuses_an_id_far_beyond_the_edge_count(tmp_path, text, line, bound):
    # 9,999,999,999 would size a 75 GiB index; 5,000,000 would make 5 M nodes, all but 3 of them isolated.
    path = write(tmp_path / "ids.txt", text)
    bad = text.split()[-1]
    with expect_error(path, line, rf"node id {bad} is out of range: expected node ids in \[0, {bound}\) .*"
                                  r"ids must be < 2 x .* edge lines \+ 1,024.*--num-nodes N"):
        read_snap(path)
    if int(bad) < 10**7:  # told the count, it believes it (and warns)
        assert read_snap(path, num_nodes=int(bad) + 1).num_nodes == int(bad) + 1


def test_read_snap_reports_the_earliest_of_several_problems(tmp_path):
    path = write(tmp_path / "bad.txt", "0 1\n1 x\n0 1 2\n")
    with expect_error(path, 2, "non-integer token 'x'"):
        read_snap(path)


def test_read_snap_real_slashdot_crlf(shared_data):
    g = read_snap(shared_data / "graphs" / "soc-Slashdot0902.txt.gz")
    src, dst = g.edges()
    assert g.num_nodes == 82_168
    assert g.num_edges == 948_464
    assert int((src == dst).sum()) == 78_303  # self-loops kept, as in SNAP's file


def test_read_snap_real_enron_against_loadtxt(shared_data):
    path = shared_data / "graphs" / "email-Enron.txt.gz"
    g = read_snap(path)
    assert g.num_nodes == 36_692 and g.num_edges == 367_662
    oracle = np.loadtxt(path, dtype=np.int64, comments="#")  # independent parser, (E, 2)
    assert g.equals(CSRGraph.from_edges(oracle[:, 0], oracle[:, 1]))
    assert g.equals(g.transpose())  # each pair is stored both ways


# --------------------------------------------------------------------------------------------- PACE / DIMACS
PACE_TEXT = "c a PACE file\np tw 5 4\n1 2\nc comment between edges\n2 3\n3 1\n3 4\n"
# undirected 0-1, 1-2, 2-0, 2-3 (0-based); node 4 isolated
PACE_INDPTR, PACE_INDICES = [0, 2, 4, 7, 8, 8], [1, 2, 0, 2, 0, 1, 3, 2]


@pytest.mark.parametrize("how", ["plain", "gz", "xz"])
def test_read_pace_hand_checked(tmp_path, how):
    g = read_pace(write(tmp_path / "g.gr", PACE_TEXT, how))
    np.testing.assert_array_equal(g.indptr, PACE_INDPTR)
    np.testing.assert_array_equal(g.indices, PACE_INDICES)


def test_read_pace_dimacs_arcs_with_weights_equal_the_pace_graph(tmp_path):
    # DIMACS 9 lists each road as two arcs 'a u v w'; m counts arcs.
    arcs = [(1, 2), (2, 1), (2, 3), (3, 2), (3, 1), (1, 3), (3, 4), (4, 3)]
    text = "c DIMACS\np sp 5 8\n" + "".join(f"a {u} {v} {10 * u + v}\n" for u, v in arcs)
    g = read_pace(write(tmp_path / "road.gr", text))
    np.testing.assert_array_equal(g.indptr, PACE_INDPTR)
    np.testing.assert_array_equal(g.indices, PACE_INDICES)


def test_read_pace_mixed_arc_and_plain_lines_tabs_crlf(tmp_path):
    text = "p tw 5 4\r\na\t1\t2\r\n2 3\r\na 3 1\r\n3\t4\r\n\r\n"
    g = read_pace(write(tmp_path / "g.gr", text))
    np.testing.assert_array_equal(g.indices, PACE_INDICES)


@pytest.mark.parametrize(
    "text, line, match",
    [
        ("1 2\np tw 2 1\n", 1, "missing header: expected 'p <kind> <n> <m>' before the first edge, found '1 2'"),
        ("c only a comment\n", None, "missing header: expected a 'p <kind> <n> <m>' line, found none"),
        ("p tw five 1\n1 2\n", 1, "bad header: expected 'p <kind> <n> <m>' with integers n and m, found 'p tw five 1'"),
        ("c x\np tw 5\n1 2\n", 2, "bad header"),
        ("px tw 2 1\n1 2\n", 1, "bad header"),
        ("p tw 3 1\n1 2\np tw 3 1\n", 3, "second 'p' header \\(the first is on line 1\\)"),
        ("p tw 3 3\n1 2\n2 3\n", 1, "the header says m = 3 edges but the file has 2 edge lines"),
        ("p tw 3 1\n0 2\n", 2, "node id 0 is out of range: ids are 1-based, expected 1..3"),
        ("p tw 3 1\n1 4\n", 2, "node id 4 is out of range"),
        ("p tw 3 2\n1 2\n1 2 3\n", 3, r"expected an edge line 'u v' or 'a u v \[weight\]', found '1 2 3'"),
        ("p sp 3 1\na 1\n", 2, "expected an edge line"),
        ("p sp 3 1\nab 1 2\n", 2, "expected a 'c' comment, the 'p' header or an edge line .* found 'ab 1 2'"),
        ("p tw 3 1\n1 b\n", 2, "non-integer token 'b'"),
        ("p tw 3 1\n1 -2\n", 2, "negative node id -2"),
        ("p tw 3 1\n# 1 2\n", 2, "expected a 'c' comment, the 'p' header or an edge line .* found '# 1 2'"),
        ("p tw 3 1\n1 2x\n", 2, "non-integer token '2x'"),
        ("p tw 0 0\n", 1, "empty graph: the header says n = 0 nodes and m = 0 edges"),
        ("p tw 9999999999 1\n1 2\n", 1, r"bad header: n = 9,999,999,999 nodes for m = 1 edges, but m edges touch "
                                        r"at most 2 nodes; expected n <= 2m \+ 1,024 = 1,026"),
    ],
)
def test_read_pace_errors(tmp_path, text, line, match):
    path = write(tmp_path / "bad.gr", text)
    with expect_error(path, line, match) as info:
        read_pace(path)
    assert info.value.line == line


def test_read_pace_nodes_without_edges(tmp_path):
    g = read_pace(write(tmp_path / "g.gr", "p tw 3 0\n"))
    assert g.num_nodes == 3 and g.num_edges == 0


@pytest.mark.slow
def test_read_pace_real_road_network(shared_data):
    g = read_pace(shared_data / "graphs" / "USA-road-NE.pace.gr.xz")
    assert g.num_nodes == 1_524_453
    assert g.num_edges == 2 * 1_934_010  # each undirected edge stored once in the file, twice here
    assert int(g.in_degree().max()) == 9
    assert g.equals(g.transpose())


# --------------------------------------------------------------------------------------------- dispatcher
def test_detect_format(tmp_path):
    (tmp_path / "ogbn_x" / "raw").mkdir(parents=True)
    (tmp_path / "planetoid").mkdir()
    (tmp_path / "planetoid" / "ind.cora.x").write_bytes(b"")
    pace_named_txt = write(tmp_path / "g.txt", "c made by hand\n\np tw 2 1\n1 2\n", "gz")
    assert detect_format(tmp_path / "ogbn_x") == "ogb"
    assert detect_format(tmp_path / "planetoid") == "planetoid"
    assert detect_format(write(tmp_path / "g.gr.xz", "p tw 2 1\n1 2\n", "xz")) == "pace"
    assert detect_format(pace_named_txt) == "pace"
    assert detect_format(write(tmp_path / "s.txt", SNAP_TEXT)) == "snap"
    assert detect_format(write(tmp_path / "s2.txt", "c,d\n")) == "snap"
    with pytest.raises(ConfigError, match="cannot tell the format of folder"):
        detect_format(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        detect_format(tmp_path / "missing.txt")


def test_read_dataset_dispatches_by_format(tmp_path):
    snap = write(tmp_path / "edges.txt.gz", SNAP_TEXT, "gz")
    pace = write(tmp_path / "road.gr", PACE_TEXT)
    ds = read_dataset(snap)
    assert isinstance(ds, GraphDataset) and ds.name == "edges" and ds.graph.equals(read_snap(snap))
    assert read_dataset(snap, format="snap", num_nodes=9).num_nodes == 9
    assert read_dataset(pace).graph.equals(read_pace(pace))
    assert read_dataset(pace, format="pace").name == "road"
    valid = "auto, snap, pace, ogb, planetoid"
    with pytest.raises(ConfigError, match=f"unknown graph format 'csv': expected one of {valid}"):
        read_dataset(snap, format="csv")
    assert set(FORMATS) == {"auto", "snap", "pace", "ogb", "planetoid", "mtx", "npy", "parquet", "metis", "arrays"}
    with pytest.raises(ConfigError, match="format 'pace' takes no option 'num_nodes': expected none"):
        read_dataset(pace, num_nodes=3)
    with pytest.raises(ConfigError, match="format 'snap' takes no option 'split': expected num_nodes or one_based"):
        read_dataset(snap, split="time")


@pytest.mark.parametrize("how", ["gz", "xz"])
def test_truncated_or_corrupt_compressed_graph_names_the_file(tmp_path, how):
    data = COMPRESS[how]("".join(f"{i} {i + 1}\n" for i in range(20_000)).encode())
    cut = tmp_path / f"cut.txt.{how}"
    cut.write_bytes(data[: len(data) // 2])
    codec = {"gz": "gzip"}.get(how, how)
    with expect_error(cut, None, f"truncated or corrupt {codec} data .*expected a complete {codec} file"):
        read_dataset(cut)
    garbage = tmp_path / f"garbage.txt.{how}"
    garbage.write_bytes(data[:6] + b"\x00junk" * 50)
    with expect_error(garbage, None, f"truncated or corrupt {codec} data"):
        read_dataset(garbage)  # detect_format reads the head first


def test_read_dataset_real_planetoid_folder(shared_data):
    ds = read_dataset(shared_data / "planetoid")
    assert ds.name == "cora" and ds.num_nodes == 2_708


def test_a_node_count_too_large_for_memory_is_refused_before_allocating(tmp_path):
    path = tmp_path / "g.txt"
    path.write_text("0 1\n")
    with pytest.raises(ConfigError, match=r"g.txt: num_nodes \(--num-nodes\) = 1,000,000,000,000 needs at least "
                                          r"[\d.]+ TiB for the per-node arrays"):
        read_snap(path, num_nodes=10**12)


# --------------------------------------------------------------------------------------------- pipes
def _fifo_with_writer(tmp_path, data: bytes):
    """A FIFO and a thread that writes ``data`` into it once, as ``cat file > fifo`` would."""
    import os
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def write_once():
        with open(fifo, "wb") as f:
            f.write(data)

    writer = threading.Thread(target=write_once, daemon=True)
    writer.start()
    return fifo, writer


def _read_in_thread(*args, **kw):
    """``read_dataset(*args, **kw)`` on a daemon thread, given 60 s (a reader that opens a FIFO twice waits
    forever for a second writer): the result, or the exception it raised."""
    import threading

    out = {}

    def run():
        try:
            out["value"] = read_dataset(*args, **kw)
        except Exception as err:  # noqa: BLE001  (handed to the test)
            out["error"] = err

    reader = threading.Thread(target=run, daemon=True)
    reader.start()
    reader.join(timeout=60)
    assert not reader.is_alive(), "the reader is still waiting on the FIFO"
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.mark.parametrize("how", ["plain", "gz"])
def test_a_fifo_is_read_once_as_a_stream(tmp_path, how):
    fifo, writer = _fifo_with_writer(tmp_path, COMPRESS[how](SNAP_TEXT.encode()))
    ds = _read_in_thread(fifo)
    writer.join(timeout=10)
    assert ds.graph.equals(CSRGraph.from_edges(SNAP_SRC, SNAP_DST))


def test_a_fifo_holding_pace_or_matrix_market_is_told_by_its_first_bytes(tmp_path):
    fifo, _ = _fifo_with_writer(tmp_path, PACE_TEXT.encode())
    assert _read_in_thread(fifo).graph.equals(read_pace(write(tmp_path / "road.gr", PACE_TEXT)))
    (tmp_path / "fifo").unlink()
    fifo, _ = _fifo_with_writer(tmp_path, b"%%MatrixMarket matrix coordinate pattern general\n3 3 2\n1 2\n2 3\n")
    assert _read_in_thread(fifo).graph.equals(CSRGraph.from_edges([0, 1], [1, 2], 3))


def test_a_pipe_errors_name_it_and_formats_that_need_a_file_are_refused(tmp_path):
    fifo, _ = _fifo_with_writer(tmp_path, b"0 1\n1 x\n")
    with expect_error(fifo, 2, "non-integer token 'x'"):
        _read_in_thread(fifo)
    (tmp_path / "fifo").unlink()
    fifo, _ = _fifo_with_writer(tmp_path, b"0 1\n")
    with pytest.raises(ConfigError, match="is a pipe, which can be read only once, front to back: format 'npy' "
                                          r"cannot be read from one \(expected snap, pace, mtx\)"):
        _read_in_thread(fifo, format="npy")


# --------------------------------------------------------------------------------------------- skip_lines
JLG_TEXT = "4,3,u,graph,Int64,simplegraph\n1,2\n2,3\n3,4\n"  # JuliaGraphs: n,m,directed,name,..., then 1-based


def test_skip_lines_reads_a_header_of_another_shape(tmp_path, caplog):
    path = write(tmp_path / "path.jlg", JLG_TEXT)
    with caplog.at_level("INFO", logger="haloflow.data.readers"):
        graph = read_dataset(path, skip_lines=1, one_based=True).graph
    assert graph.equals(CSRGraph.from_edges([0, 1, 2], [1, 2, 3]))
    assert "skipped the first 1 line (skip_lines)" in caplog.text
    # Line numbers still count the skipped lines.
    with expect_error(write(tmp_path / "bad.jlg", JLG_TEXT + "4,x\n"), 5, "non-integer token 'x'"):
        read_snap(tmp_path / "bad.jlg", skip_lines=1)


@pytest.mark.parametrize("header", ["4,3,u,graph,Int64,simplegraph", "4,3,u"])
def test_a_header_of_another_shape_is_an_error_that_says_how_to_skip_it(tmp_path, header):
    # 6 fields: more than an edge line holds; 3 fields: fine alone, but the next line has 2.
    path = write(tmp_path / "g.jlg", header + "\n1,2\n2,3\n")
    with expect_error(path, 1 if header.count(",") > 3 else 2, re.escape(
            "; if line 1 is a header, pass skip_lines=1 (--skip-lines 1)")):
        read_snap(path)
    # A bad line deep in a file gets no such hint.
    with pytest.raises(InputFormatError) as caught:
        read_snap(write(tmp_path / "deep.txt", "0 1\n1 2\n2 3 4 5 6\n"))
    assert "skip" not in str(caught.value)
