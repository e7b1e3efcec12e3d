"""bench contention: the ratios from hand-built step times, the co-tenants' lives, and a tiny real run (the
table and the JSON's shape; no timings are asserted)."""

import argparse
import json

import pytest

from haloflow._openmp import CHOSEN_BY, caller_environ
from haloflow.bench.contention import CoTenants, main, summarize


def _args(**kw):
    return argparse.Namespace(**{"families": ["dlrm"], "threads": [1, 2], "load": 2, **kw})


def test_slowdowns_and_thread_ratios_from_known_times():
    ms = 1e-3
    times = {("dlrm", "haloflow", 1, 0): [10 * ms, 10 * ms, 99 * ms], ("dlrm", "haloflow", 1, 2): [30 * ms],
             ("dlrm", "haloflow", 2, 0): [5 * ms], ("dlrm", "haloflow", 2, 2): [15 * ms],
             ("dlrm", "peer", 1, 0): [4 * ms], ("dlrm", "peer", 1, 2): [12 * ms],
             ("dlrm", "peer", 2, 0): [2 * ms], ("dlrm", "peer", 2, 2): [12 * ms]}
    one, two = summarize(times, _args())
    assert one["haloflow_quiet_ms"] == pytest.approx(10) and one["haloflow_slowdown"] == pytest.approx(3)  # median
    assert one["slowdown_vs_peer"] == pytest.approx(1) and one["haloflow_loaded_vs_1_thread"] is None
    assert "target_slowdown_met" not in one  # the targets are the multi-thread row's
    assert two["haloflow_slowdown"] == pytest.approx(3) and two["peer_slowdown"] == pytest.approx(6)
    assert two["slowdown_vs_peer"] == pytest.approx(0.5) and two["target_slowdown_met"] is True
    assert two["haloflow_loaded_vs_1_thread"] == pytest.approx(0.5) and two["target_threads_met"] is True
    assert two["peer_loaded_vs_1_thread"] == pytest.approx(1)


def test_a_side_that_did_not_run_leaves_its_ratios_empty():
    ms = 1e-3
    times = {("dlrm", "haloflow", 2, 0): [5 * ms], ("dlrm", "haloflow", 2, 2): [20 * ms]}
    (row,) = summarize(times, _args(threads=[2]))
    assert row["haloflow_slowdown"] == pytest.approx(4) and row["peer_slowdown"] is None
    assert row["slowdown_vs_peer"] is None and row["target_slowdown_met"] is None


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
    assert main(["--size", "tiny", "--rounds", "1", "--steps", "1", "--warmup", "1", "--load", "1",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "1 busy co-tenants" in text and "haloflow / peer slowdown" in text and f"wrote {out}" in text
    result = json.loads(out.read_text())
    assert [(r["family"], r["threads"]) for r in result["rows"]] == [(f, t) for f in ("gcn", "dlrm", "tgn")
                                                                    for t in (1, 2)]
    assert set(result["workers"]) == {"haloflow x1", "haloflow x2", "peer x1", "peer x2"}
    assert {k: w["threads"] for k, w in result["workers"].items()} == {"haloflow x1": 1, "haloflow x2": 2,
                                                                      "peer x1": 1, "peer x2": 2}
    if not any(name in caller_environ() for name in CHOSEN_BY):  # haloflow's default on one side, torch's on the other
        assert {w["wait_policy"] for k, w in result["workers"].items() if k.startswith("haloflow")} == {"passive"}
        assert all(w["wait_policy"].startswith("spinning (torch was imported before haloflow")
                   for k, w in result["workers"].items() if k.startswith("peer"))
    for row in result["rows"]:
        assert row["haloflow_slowdown"] > 0 and row["peer_slowdown"] > 0
    assert {(t["family"], t["side"], t["threads"], t["load"]) for t in result["times_s"]} == {
        (f, s, t, n) for f in ("gcn", "dlrm", "tgn") for s in ("haloflow", "peer") for t in (1, 2) for n in (0, 1)}
    assert len(result["loadavg_before"]) == 3
