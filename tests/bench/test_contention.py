"""bench contention: the ratios from hand-built step times, the co-tenants' lives, and a tiny real run (the
table and the JSON's shape; no timings are asserted)."""

import argparse
import json

import pytest

from haloflow.host.openmp import CHOSEN_BY, caller_environ
from haloflow.bench.contention import CoTenants, main, summarize


def _args(**kw):
    return argparse.Namespace(**{"families": ["dlrm"], "threads": [1, 2], "load": 2, "steps": 1, **kw})


MS = 1e-3


def _rows(times, **kw):
    return {(r["side"], r["threads"]): r for r in summarize(times, _args(**kw))}


def test_slowdowns_and_thread_ratios_from_known_times():
    # two rounds of one step each: every ratio is the median (here the mean) of the two rounds' ratios
    times = {("dlrm", "haloflow", 1, 0): [10 * MS, 20 * MS], ("dlrm", "haloflow", 1, 2): [30 * MS, 40 * MS],
             ("dlrm", "haloflow", 2, 0): [5 * MS, 5 * MS], ("dlrm", "haloflow", 2, 2): [15 * MS, 20 * MS],
             ("dlrm", "fixed", 2, 0): [5 * MS, 5 * MS], ("dlrm", "fixed", 2, 2): [30 * MS, 44 * MS],
             ("dlrm", "peer", 1, 0): [4 * MS, 4 * MS], ("dlrm", "peer", 1, 2): [12 * MS, 12 * MS],
             ("dlrm", "peer", 2, 0): [2 * MS, 2 * MS], ("dlrm", "peer", 2, 2): [12 * MS, 12 * MS]}
    rows = _rows(times)
    assert list(rows) == [("peer", 1), ("haloflow", 1), ("peer", 2), ("haloflow", 2), ("fixed", 2)]
    one, two, fixed = rows["haloflow", 1], rows["haloflow", 2], rows["fixed", 2]
    assert one["quiet_ms"] == pytest.approx(15) and one["slowdown"] == pytest.approx((3 + 2) / 2)
    assert one["slowdown_vs_peer"] == pytest.approx((1 + 2 / 3) / 2) and one["loaded_vs_1_thread"] is None
    assert "target_slowdown_met" not in one  # the targets are the multi-thread rows'
    assert two["slowdown"] == pytest.approx(3.5) and rows["peer", 2]["slowdown"] == pytest.approx(6)
    assert two["slowdown_vs_peer"] == pytest.approx(3.5 / 6) and two["target_slowdown_met"] is True
    assert two["loaded_vs_1_thread"] == pytest.approx(0.5) and two["target_threads_met"] is True
    assert fixed["loaded_vs_1_thread"] == pytest.approx((1 + 1.1) / 2)  # against haloflow's own 1 thread
    assert fixed["target_threads_met"] is True  # 1.05: within the tolerance
    assert rows["peer", 2]["loaded_vs_1_thread"] == pytest.approx(1) and "target_threads_met" not in rows["peer", 2]


def test_a_step_is_the_mean_of_its_round_and_the_ms_the_median_over_rounds():
    times = {("dlrm", "haloflow", 2, 0): [10 * MS, 30 * MS, 12 * MS, 12 * MS, 50 * MS, 50 * MS],  # 20, 12, 50
             ("dlrm", "haloflow", 2, 2): [40 * MS] * 6}
    row = _rows(times, threads=[2], steps=2)["haloflow", 2]
    assert row["quiet_ms"] == pytest.approx(20) and row["slowdown"] == pytest.approx(2)  # 2, 3.33, 0.8


def test_a_side_that_did_not_run_leaves_its_ratios_empty():
    times = {("dlrm", "haloflow", 2, 0): [5 * MS], ("dlrm", "haloflow", 2, 2): [20 * MS]}
    row = _rows(times, threads=[2])["haloflow", 2]
    assert row["slowdown"] == pytest.approx(4) and row["slowdown_vs_peer"] is None
    assert row["target_slowdown_met"] is None and row["loaded_vs_1_thread"] is None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_co_tenants_run_inside_the_block_and_are_gone_after():
    with CoTenants(2) as tenants:
        pids = [p.pid for p in tenants.procs]
        assert len(pids) == 2 and all(_alive(pid) for pid in pids)
    assert not any(_alive(pid) for pid in pids)
    with CoTenants(0) as none:
        assert none.procs == []


def test_a_tiny_run_prints_the_table_and_writes_every_row(tmp_path, capsys):
    pytest.importorskip("torch_geometric")
    out = tmp_path / "contention.json"
    assert main(["--size", "tiny", "--rounds", "1", "--steps", "1", "--warmup", "1", "--load", "1", "--settle", "0",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "1 busy co-tenants" in text and "haloflow --fixed-threads" in text and f"wrote {out}" in text
    result = json.loads(out.read_text())
    sides = [("peer", 1), ("haloflow", 1), ("peer", 2), ("haloflow", 2), ("fixed", 2)]
    assert [(r["family"], r["side"], r["threads"]) for r in result["rows"]] == [
        (f, side, t) for f in ("gcn", "dlrm", "tgn") for side, t in sides]
    assert {k: w["threads"] for k, w in result["workers"].items()} == {
        "haloflow x1": 1, "haloflow x2": 2, "fixed x2": 2, "peer x1": 1, "peer x2": 2}
    if not any(name in caller_environ() for name in CHOSEN_BY):  # haloflow's default on one side, torch's on the other
        assert {w["wait_policy"] for k, w in result["workers"].items()
                if not k.startswith("peer")} == {"spin 10,000 pauses, then sleep"}
        assert all(w["wait_policy"] == "OpenMP's default (spinning)"  # plain PyTorch: haloflow applied nothing
                   for k, w in result["workers"].items() if k.startswith("peer"))
    # haloflow's (adapting) workers put MKL in its reproducible mode before their first product, where torch has
    # MKL; the fixed-thread control and the peer do not ask
    import torch
    assert {k: w["reproducible_blas"] for k, w in result["workers"].items()} == {
        "haloflow x1": torch.backends.mkl.is_available(), "haloflow x2": torch.backends.mkl.is_available(),
        "fixed x2": None, "peer x1": None, "peer x2": None}
    for row in result["rows"]:
        assert row["slowdown"] > 0 and (row["side"] == "peer" or row["slowdown_vs_peer"] > 0)
    assert {(t["family"], t["side"], t["threads"], t["load"]) for t in result["times_s"]} == {
        (f, s, t, n) for f in ("gcn", "dlrm", "tgn") for s, t in sides for n in (0, 1)}
    assert len(result["loadavg_before"]) == 3 and result["tolerance"] == 0.05
