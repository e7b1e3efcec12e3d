import gzip
import lzma
import re

import numpy as np
import pytest

from haloflow.data.temporal import (
    TemporalEvents,
    chronological_split,
    inductive_nodes,
    read_jodie_csv,
    read_snap_temporal,
)
from haloflow.errors import ConfigError, InputFormatError


def write(path, text: str, gz: bool = False):
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    return path


def expect_error(path, line, match):
    """pytest.raises for an InputFormatError at ``path:line`` whose message matches ``match``."""
    where = re.escape(f"{path}:{line}: ") if line is not None else re.escape(f"{path}: ")
    return pytest.raises(InputFormatError, match=where + ".*" + match)


# --------------------------------------------------------------------------------------------- TemporalEvents
def test_events_convert_dtypes_and_keep_integer_times():
    ev = TemporalEvents(src=[0, 1], dst=[2, 2], t=[3, 5], num_nodes=3, label=[0, 1])
    assert ev.src.dtype == np.int64 and ev.t.dtype == np.int64 and ev.label.dtype == np.float32
    assert ev.num_events == len(ev) == 2 and ev.edge_dim == 0
    assert TemporalEvents(src=[0], dst=[1], t=[0.5], num_nodes=2).t.dtype == np.float64


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(src=[0, 1], dst=[1, 0], t=[5, 4], num_nodes=2), r"time order: t\[1\] = 4 < t\[0\] = 5"),
        (dict(src=[0, 3], dst=[1, 0], t=[1, 2], num_nodes=3), r"node id 3 is outside \[0, num_nodes=3\)"),
        (dict(src=[0, 1], dst=[1], t=[1, 2], num_nodes=2), r"dst must have shape \(2,\)"),
        (dict(src=[0], dst=[1], t=[1], num_nodes=2, edge_feat=[1.0]), r"edge_feat must have shape \(1, F\)"),
        (dict(src=[0], dst=[1], t=[np.nan], num_nodes=2), "must be finite"),
    ],
)
def test_events_reject_bad_arrays(kw, match):
    with pytest.raises(ConfigError, match=match):
        TemporalEvents(**kw)


def test_head_is_a_prefix():
    ev = TemporalEvents(src=[0, 1, 2], dst=[1, 2, 0], t=[1, 2, 3], num_nodes=3, edge_feat=np.eye(3))
    h = ev.head(2)
    np.testing.assert_array_equal(h.t, [1, 2])
    assert h.edge_feat.shape == (2, 3) and h.num_nodes == 3


# --------------------------------------------------------------------------------------------- JODIE CSV
OURS = "u,i,ts,label\n0,3,0,0\n1,3,36,0\n\n0,4,36,1\n2,3,77,0\n"


@pytest.mark.parametrize("gz", [False, True])
def test_read_jodie_csv_ids_in_one_space(tmp_path, gz):
    ev = read_jodie_csv(write(tmp_path / "w.csv", OURS, gz))  # a blank line in the middle is skipped
    np.testing.assert_array_equal(ev.src, [0, 1, 0, 2])
    np.testing.assert_array_equal(ev.dst, [3, 3, 4, 3])
    np.testing.assert_array_equal(ev.t, [0, 36, 36, 77])
    np.testing.assert_array_equal(ev.label, [0, 0, 1, 0])
    assert ev.t.dtype == np.int64 and ev.num_nodes == 5 and ev.edge_feat is None


def test_read_jodie_csv_with_feature_columns(tmp_path):
    ev = read_jodie_csv(write(tmp_path / "w.csv", "u,i,ts,label,f0,f1\n0,2,0.5,0,0.25,-1\n1,2,1.5,0,2,3e-1\n"))
    np.testing.assert_array_equal(ev.t, [0.5, 1.5])
    assert ev.t.dtype == np.float64
    np.testing.assert_array_equal(ev.edge_feat, np.array([[0.25, -1], [2, 0.3]], dtype=np.float32))


def test_read_jodie_original_layout_offsets_items(tmp_path):
    # JODIE's own header names the feature list once; users 0..2, items 0..1 -> nodes 3..4.
    text = ("user_id,item_id,timestamp,state_label,comma_separated_list_of_features\n"
            "0,0,0.0,0,0.1,0.2,0.3\n2,1,4.0,1,0.0,0.0,1.0\n1,0,4.0,0,1,1,1\n")
    ev = read_jodie_csv(write(tmp_path / "wikipedia.csv", text))
    np.testing.assert_array_equal(ev.src, [0, 2, 1])
    np.testing.assert_array_equal(ev.dst, [3, 4, 3])
    np.testing.assert_array_equal(ev.t, [0, 4, 4])  # whole-number float times become int64
    assert ev.t.dtype == np.int64 and ev.num_nodes == 5 and ev.edge_dim == 3
    np.testing.assert_array_equal(ev.label, [0, 1, 0])


@pytest.mark.parametrize(
    "text, line, match",
    [
        ("src,dst,time\n0,1,2\n", 1, "unknown header: expected 'u,i,ts,label.*found 'src,dst,time'"),
        ("", 1, "unknown header: .*found an empty file"),
        ("u,i,ts,label\n0,1,0,0\n1,2,3\n", 3, "expected 4 comma-separated fields, found 3: '1,2,3'"),
        ("u,i,ts,label\n0,1,0,0\n\n1,x,3,0\n", 4, r"field 2 \(i\) is 'x': expected an integer node id"),
        ("u,i,ts,label\n0,1,0,0\n1,2,soon,0\n", 3, r"field 3 \(ts\) is 'soon': expected a number"),
        ("u,i,ts,label\n0,1,0,0\n1,2,,0\n", 3, r"empty field 3 \(ts\): expected a number"),
        ("u,i,ts,label\n0,1,0,0\n-1,2,3,0\n", 3, "negative u -1: expected ids >= 0"),
        ("u,i,ts,label\n0,1,5,0\n\n1,2,7,0\n1,2,6,0\n", 5, "timestamps must not decrease: 6 comes after 7 on line 4"),
        ("u,i,ts,label\n0,1,nan,0\n", 2, "timestamp nan: expected a finite number"),
        ("u,i,ts,label\n0,1,0,0\n1,1030,1,0\n", 3, "node id 1,030 is out of range: ids must be < 2 x 2 events "
                                                 "\\+ 1,024.*renumber"),
        ("user_id,item_id,timestamp,state_label,features\n0,0,0,0,1.0\n0,1,1,0\n", 3,
         "expected 5 comma-separated fields, found 4"),
    ],
)
def test_read_jodie_csv_errors_name_file_line_found_and_expected(tmp_path, text, line, match):
    path = write(tmp_path / "bad.csv", text)
    with expect_error(path, line, match) as info:
        read_jodie_csv(path)
    assert info.value.line == line


def test_read_jodie_csv_real_wikipedia(shared_data):
    ev = read_jodie_csv(shared_data / "temporal" / "jodie_wikipedia_edges.csv")
    assert ev.num_events == 157_474 and ev.num_nodes == 9_227
    assert ev.src.max() == 8_226 and ev.dst.min() == 8_227 and ev.dst.max() == 9_226  # users, then pages
    assert int(ev.label.sum()) == 217
    assert ev.t.dtype == np.int64 and ev.t[0] == 0 and ev.t[-1] == 2_678_373


# --------------------------------------------------------------------------------------------- SNAP temporal
SNAP = "# a SNAP temporal graph\n% a KONECT-style comment\n0 1 100\n2\t1\t100\n\n1   0 250\n# mid\n3 2 900\n"


@pytest.mark.parametrize("gz", [False, True])
def test_read_snap_temporal(tmp_path, gz):
    ev = read_snap_temporal(write(tmp_path / "sx.txt", SNAP, gz))
    np.testing.assert_array_equal(ev.src, [0, 2, 1, 3])
    np.testing.assert_array_equal(ev.dst, [1, 1, 0, 2])
    np.testing.assert_array_equal(ev.t, [100, 100, 250, 900])
    assert ev.num_nodes == 4 and ev.label is None
    assert read_snap_temporal(write(tmp_path / "n.txt", SNAP), num_nodes=10).num_nodes == 10


def test_read_snap_temporal_sort_is_stable(tmp_path):
    ev = read_snap_temporal(write(tmp_path / "u.txt", "0 1 5\n1 2 3\n2 3 5\n3 4 3\n"), sort=True)
    np.testing.assert_array_equal(ev.t, [3, 3, 5, 5])
    np.testing.assert_array_equal(ev.src, [1, 3, 0, 2])  # equal times keep file order


@pytest.mark.parametrize(
    "text, line, match",
    [
        ("0 1 5\n1 2\n", 2, r"expected 3 fields \(src dst unix_time\) .* found 2: '1 2'"),
        ("0 1 5\n1 2 3.5\n", 2, r"non-integer token '3\.5': expected an integer timestamp"),
        ("0 1 5\n1 -2 6\n", 2, "negative node id -2: expected node ids >= 0"),
        ("# c\n0 1 5\n% c\n1 2 7\n2 3 6\n", 5, "timestamps must not decrease: 6 comes after 7 on line 4"),
    ],
)
def test_read_snap_temporal_errors(tmp_path, text, line, match):
    path = write(tmp_path / "bad.txt", text)
    with expect_error(path, line, match):
        read_snap_temporal(path)


def test_read_snap_temporal_unsorted_across_blocks_and_id_bound(tmp_path):
    for bad in range(150, 158):  # 64-byte blocks hold ~6 lines: one of these falls first in a block
        lines = [f"{i} {i + 1} {10 * i}" for i in range(200)]
        lines[bad] = "5 6 1"
        path = write(tmp_path / "long.txt", "\n".join(lines) + "\n")
        with expect_error(path, bad + 1, f"1 comes after {10 * (bad - 1)} on line {bad}"):
            read_snap_temporal(path, block_bytes=64)
    path = tmp_path / "ok.txt"
    with expect_error(path, 1, r"node id 1 is out of range: expected node ids in \[0, 1\)"):
        read_snap_temporal(write(tmp_path / "ok.txt", "0 1 5\n"), num_nodes=1)
    path = write(tmp_path / "stray.txt", "0 1 5\n1 2 6\n2 9999999999 7\n")
    with expect_error(path, 3, "node id 9999999999 is out of range: without num_nodes, ids must be < 2 x 3 events"):
        read_snap_temporal(path)
    assert read_snap_temporal(path, num_nodes=10**10).num_nodes == 10**10  # told: believed


# --------------------------------------------------------------------------------------------- splits
def _stream(t):
    n = len(t)
    return TemporalEvents(src=np.arange(n) % 3, dst=3 + np.arange(n) % 2, t=t, num_nodes=5)


def test_chronological_split_70_15_15():
    sp = chronological_split(_stream(np.arange(20)))
    assert (sp.train_end, sp.val_end) == (14, 17)
    np.testing.assert_array_equal(sp.ids("val"), [14, 15, 16])
    assert sp.mask("test").sum() == 3 and sp.mask("train")[:14].all()


def test_chronological_split_keeps_ties_on_one_side():
    # The 70% cut (after event 13) falls inside the run of t = 7 at events 12..15: the run stays in train.
    t = np.array([0, 1, 2, 3, 4, 5, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 8, 9, 10, 11])
    sp = chronological_split(_stream(t))
    assert sp.train_end == 16 and t[sp.train_end - 1] < t[sp.train_end]
    assert sp.val_end == 17


@pytest.mark.parametrize(
    "t, kw, match",
    [
        (np.arange(10), dict(val=0.0), r"val must be in \(0, 1\)"),
        (np.arange(10), dict(val=0.5, test=0.5), "val \\+ test = 0.5 \\+ 0.5 = 1.0 must be < 1"),
        (np.zeros(10, dtype=int), {}, "train/val/test sizes 10/0/0: expected three non-empty parts"),
    ],
)
def test_chronological_split_errors(t, kw, match):
    with pytest.raises(ConfigError, match=match):
        chronological_split(_stream(t), **kw)


def test_inductive_nodes_follows_tgn_protocol():
    rng = np.random.default_rng(0)
    e, n = 400, 60
    ev = TemporalEvents(src=rng.integers(0, 40, e), dst=rng.integers(40, n, e), t=np.arange(e), num_nodes=n)
    sp = chronological_split(ev)
    ind = inductive_nodes(ev, sp, fraction=0.1, seed=3)
    appearing = np.union1d(ev.src, ev.dst)
    late = np.union1d(ev.src[sp.train_end:], ev.dst[sp.train_end:])
    assert ind.held_out.size == int(0.1 * appearing.size)
    assert np.isin(ind.held_out, late).all()
    # Brute force: the kept training events touch no held-out node; new-node events have an endpoint that no
    # kept training event touches.
    hidden = set(ind.held_out.tolist())
    kept = [i for i in range(sp.train_end) if ev.src[i] not in hidden and ev.dst[i] not in hidden]
    np.testing.assert_array_equal(ind.train_ids, kept)
    seen = set(ev.src[kept].tolist()) | set(ev.dst[kept].tolist())
    new = np.array([ev.src[i] not in seen or ev.dst[i] not in seen for i in range(e)])
    np.testing.assert_array_equal(ind.new_node_val_mask, new & sp.mask("val"))
    np.testing.assert_array_equal(ind.new_node_test_mask, new & sp.mask("test"))
    assert ind.new_node_test_mask.any()
    again = inductive_nodes(ev, sp, fraction=0.1, seed=3)
    np.testing.assert_array_equal(again.held_out, ind.held_out)  # seeded


def test_inductive_nodes_errors():
    ev = _stream(np.arange(20))
    sp = chronological_split(ev)
    with pytest.raises(ConfigError, match=r"fraction must be in \[0, 1\], got 1.5"):
        inductive_nodes(ev, sp, fraction=1.5)
    early = TemporalEvents(src=np.r_[np.arange(14), np.zeros(6, int)], dst=np.full(20, 14), t=np.arange(20),
                           num_nodes=15)  # only nodes 0 and 14 have val/test events
    with pytest.raises(ConfigError, match=r"7 nodes asked for \(fraction 0.5\) but only 2 appear in val/test"):
        inductive_nodes(early, chronological_split(early), fraction=0.5)
    with pytest.raises(ConfigError, match="split is of 20 events but the stream has 10"):
        inductive_nodes(ev.head(10), sp)


@pytest.mark.parametrize("codec", [gzip.compress, lzma.compress])
def test_a_cut_compressed_jodie_csv_is_one_error_naming_it(tmp_path, codec):
    data = codec(("u,i,ts,label\n" + "".join(f"{k},{k + 1},{k},0\n" for k in range(2000))).encode())
    path = tmp_path / "events.csv"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputFormatError, match=r"events.csv: truncated or corrupt (gzip|xz) data"):
        read_jodie_csv(path)

