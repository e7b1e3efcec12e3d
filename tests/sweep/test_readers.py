"""The sweep over the text readers: SNAP and PACE edge lists, JODIE CSV and SNAP temporal streams, Criteo TSV and
CSV (through ``preprocess_criteo``, whose output must appear whole or not at all). Each example is a small valid
file drawn by hypothesis, then broken by ``mutate`` (see mutate.py), read in this process."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from haloflow.data.criteo import CriteoPreprocessConfig, preprocess_criteo
from haloflow.data.readers import read_dataset, read_pace, read_snap
from haloflow.data.temporal import read_jodie_csv, read_snap_temporal
from tests.sweep.mutate import SWEEP, check_clean, mutate

pytestmark = pytest.mark.timeout(300)


def _edges(data, one_based: bool = False) -> tuple[int, list[tuple[int, int]]]:
    n = data.draw(st.integers(2, 30))
    m = data.draw(st.integers(1, 40))
    pairs = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), min_size=m, max_size=m))
    return n, [(u + one_based, v + one_based) for u, v in pairs]


def _write(folder: str, name: str, raw: bytes) -> Path:
    path = Path(folder) / name
    path.write_bytes(raw)
    return path


@settings(max_examples=300, **SWEEP)
@given(st.data())
def test_snap_edge_lists(data):
    one_based = data.draw(st.booleans())
    n, pairs = _edges(data, one_based)
    sep = data.draw(st.sampled_from(["\t", " ", ","]))
    weighted = data.draw(st.booleans())
    lines = ["# a SNAP graph", *(["src dst weight" if weighted else "src dst"] if data.draw(st.booleans()) else [])]
    lines += [sep.join([str(u), str(v)] + (["0.5"] if weighted else [])) for u, v in pairs]
    raw = mutate(data, ("\n".join(lines) + "\n").encode())
    options = data.draw(st.sampled_from([{}, {"one_based": one_based}, {"num_nodes": n},
                                         {"num_nodes": data.draw(st.sampled_from([0, 1, n - 1, 10**12]))}]))
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(tmp, "g.txt", raw)
        check_clean("SNAP edge list", lambda: read_snap(path, **options), "g.txt", "num_nodes")
        check_clean("SNAP edge list", lambda: read_dataset(path), "g.txt")


@settings(max_examples=200, **SWEEP)
@given(st.data())
def test_pace_gr(data):
    n, pairs = _edges(data, one_based=True)
    dimacs = data.draw(st.booleans())
    lines = ["c a PACE graph", f"p {'sp' if dimacs else 'tw'} {n} {len(pairs)}"]
    lines += [f"a {u} {v} 7" if dimacs else f"{u} {v}" for u, v in pairs]
    raw = mutate(data, ("\n".join(lines) + "\n").encode())
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(tmp, "g.gr", raw)
        check_clean("PACE .gr", lambda: read_pace(path), "g.gr")
        check_clean("PACE .gr", lambda: read_dataset(path, format="pace"), "g.gr")


@settings(max_examples=200, **SWEEP)
@given(st.data())
def test_jodie_csv(data):
    n, pairs = _edges(data)
    jodie = data.draw(st.booleans())
    features = data.draw(st.integers(0, 2))
    header = ["user_id", "item_id", "timestamp", "state_label"] if jodie else ["u", "i", "ts", "label"]
    header += [f"f{j}" for j in range(features)] if not jodie else (["comma_separated_list_of_features"]
                                                                      if features else [])
    times = sorted(data.draw(st.lists(st.integers(0, 1000), min_size=len(pairs), max_size=len(pairs))))
    lines = [",".join(header)] + [",".join([str(u), str(v), f"{t}.0" if jodie else str(t), "0"]
                                           + ["0.25"] * features) for (u, v), t in zip(pairs, times)]
    raw = mutate(data, ("\n".join(lines) + "\n").encode())
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(tmp, "events.csv", raw)
        check_clean("JODIE CSV", lambda: read_jodie_csv(path), "events.csv")


@settings(max_examples=200, **SWEEP)
@given(st.data())
def test_snap_temporal(data):
    n, pairs = _edges(data)
    times = sorted(data.draw(st.lists(st.integers(0, 10**9), min_size=len(pairs), max_size=len(pairs))))
    lines = ["# src dst unix_time"] + [f"{u} {v} {t}" for (u, v), t in zip(pairs, times)]
    raw = mutate(data, ("\n".join(lines) + "\n").encode())
    options = data.draw(st.sampled_from([{}, {"sort": True}, {"num_nodes": n}, {"num_nodes": 1}]))
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(tmp, "events.txt", raw)
        check_clean("SNAP temporal", lambda: read_snap_temporal(path, **options), "events.txt", "num_nodes")


def _criteo_line(data, sep: str) -> str:
    label = data.draw(st.sampled_from(["0", "1"]))
    dense = [data.draw(st.sampled_from(["", "0", "3", "17", "-1", "250"])) for _ in range(13)]
    sparse = [data.draw(st.sampled_from(["", "68fd1e64", "80e26c9b", "0b153874", "a"])) for _ in range(26)]
    return sep.join([label, *dense, *sparse])


@settings(max_examples=60, **SWEEP)
@given(st.data())
def test_criteo_tsv_and_csv(data):
    csv = data.draw(st.booleans())
    sep = "," if csv else "\t"
    rows = [_criteo_line(data, sep) for _ in range(data.draw(st.integers(1, 16)))]
    if csv:
        rows.insert(0, ",".join(["label"] + [f"I{j}" for j in range(1, 14)] + [f"C{j}" for j in range(1, 27)]))
    raw = mutate(data, ("\n".join(rows) + "\n").encode())
    mode = data.draw(st.sampled_from([{"max_ind_range": 97}, {"min_count": 1}, {"min_count": 2}]))
    strict = data.draw(st.booleans())
    suffix = data.draw(st.sampled_from(["", "", ".gz", ".xz", ".bz2"]))  # the name may hide or misname a codec
    with tempfile.TemporaryDirectory() as tmp:
        name = ("train.csv" if csv else "train.txt") + suffix
        path = _write(tmp, name, raw)
        out = Path(tmp) / "out"

        def run():
            return preprocess_criteo(CriteoPreprocessConfig(raw=(path,), out=out, strict=strict, **mode))

        result = check_clean("Criteo TSV/CSV", run, name)
        # Whole or nothing: a refused input leaves no folder and no temporary beside it.
        assert out.is_dir() == (result is not None)
        assert sorted(p.name for p in Path(tmp).iterdir()) == sorted([name] + (["out"] if result else []))
