"""TRACEBACK: values past a type's or the machine's range, tiny inputs, and ``bench`` / ``demo`` settings that
ended in a traceback (issue 37). Each case now ends with one line (argparse's: its usage line, then one) and exit
2, before any work."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.sweep.cases import DLRM, GCN, TGN, Case, run_case

pytestmark = pytest.mark.timeout(300)

BIG = "9223372036854775808"  # 2^63: one past int64
_PLAN = ("plan-tables", "--world-size", "2", "--memory-per-rank", "1GiB")
_PART = ("partition", "{in}/g.txt", "--parts", "2", "--out", "{tmp}/parts")


def _bench(name: str, *flags: str) -> tuple[str, ...]:
    return ("bench", name, *flags, "--out", "{tmp}/r.json")


CASES = [
    # past a type's range
    Case("gcn-seed-past-int64", (*GCN, "--seed", BIG), 2, "argument --seed"),
    Case("dlrm-seed-past-int64", (*DLRM, "--seed", BIG), 2, "argument --seed"),
    Case("tgn-seed-past-int64", (*TGN, "--seed", BIG), 2, "argument --seed"),
    Case("gcn-hidden-past-int64", (*GCN, "--hidden", BIG), 2, "argument --hidden"),
    Case("dlrm-batch-past-int64", (*DLRM, "--batch-size", BIG), 2, "argument --batch-size"),
    Case("partition-seed-past-int64", (*_PART, "--seed", BIG), 2, "--seed must be an integer in [0, 2147483647]"),
    Case("partition-seed-past-int32", (*_PART, "--seed", "4294967296"), 2, "--seed must be an integer"),
    Case("memory-budget-1e100GiB", (*_PART, "--method", "random", "--memory-budget", "1e100GiB"), 2,
         "more bytes than a 64-bit size holds", absent=("{tmp}/parts",)),
    Case("memory-budget-1e30", (*_PART, "--method", "random", "--memory-budget", "1e30"), 2, "8EiB"),
    Case("plan-tables-huge-rows", (*_PLAN, "--tables", "{in}/huge-rows.json"), 2, "more weights than a 64-bit"),
    Case("plan-tables-huge-dim", (*_PLAN, "--tables", "{in}/huge-dim.json"), 2, "huge-dim.json"),
    Case("plan-tables-dim-flag-huge", (*_PLAN, "--tables", "kaggle", "--dim", "100000000000000000000"), 2,
         "--dim must be <= 2,147,483,648"),
    Case("plan-tables-batch-huge", (*_PLAN, "--tables", "kaggle", "--batch-size", BIG), 2, "--batch-size must be"),
    # past the machine's memory
    Case("tgn-memory-dim-1e8", (*TGN, "--memory-dim", "100000000"), 2, "do not fit in this machine's memory"),
    # tiny inputs
    Case("tgn-0-events", (*TGN[:3], "{in}/events0.csv", *TGN[4:]), 2, "0 events"),
    Case("tgn-1-event", (*TGN[:3], "{in}/events1.csv", *TGN[4:]), 2, "1 events"),
    Case("tgn-fewer-events-than-a-batch", (*TGN[:3], "{in}/events5.csv", *TGN[4:]), 2, "5 events"),
    # bench and demo: checked before anything is generated
    Case("bench-gcn-nodes-0", _bench("gcn", "--nodes", "0"), 2, "argument --nodes"),
    Case("bench-gcn-entries-0", _bench("gcn", "--entries", "0"), 2, "argument --entries"),
    Case("bench-gcn-epochs-0", _bench("gcn", "--epochs", "0"), 2, "argument --epochs"),
    Case("bench-gcn-dist-ks-abc", _bench("gcn-dist", "--ks", "abc"), 2, "argument --ks"),
    Case("bench-gcn-dist-ks-empty-item", _bench("gcn-dist", "--ks", "1,,2"), 2, "an empty item"),
    Case("bench-gcn-dist-scale-0", _bench("gcn-dist", "--scale", "0"), 2, "argument --scale"),
    Case("bench-gcn-dist-epochs-0", _bench("gcn-dist", "--epochs", "0"), 2, "argument --epochs"),
    Case("bench-grad-sync-steps-0", _bench("grad-sync", "--steps", "0"), 2, "argument --steps"),
    Case("bench-grad-sync-ks-0", _bench("grad-sync", "--ks", "0"), 2, "each K must be in"),
    Case("bench-tgn-batches-0", _bench("tgn", "--batches", "0"), 2, "argument --batches"),
    Case("bench-tgn-ks-abc", _bench("tgn", "--ks", "abc"), 2, "argument --ks"),
    Case("bench-tgn-epochs-0", _bench("tgn", "--epochs", "0"), 2, "argument --epochs"),
    Case("bench-partition-unknown-graph", _bench("partition", "--graphs", "nosuch"), 2, "unknown 'nosuch'"),
    Case("bench-partition-parts-abc", _bench("partition", "--parts", "abc"), 2, "argument --parts"),
    Case("bench-halo-build-scale-0", _bench("halo-build", "--scale", "0"), 2, "scale must be in"),
    Case("bench-readers-repeat-0", _bench("readers", "--repeat", "0"), 2, "argument --repeat"),
    Case("bench-readers-unknown-graph", _bench("readers", "--graphs", "x"), 2, "argument --graphs"),
    Case("bench-dlrm-memory-ks-0", _bench("dlrm-memory", "--ks", "0"), 2, "argument --ks"),
    Case("bench-dlrm-memory-steps-0", _bench("dlrm-memory", "--steps", "0"), 2, "argument --steps"),
    Case("bench-cache-scale-0", _bench("cache", "--scale", "0"), 2, "argument --scale"),
    Case("bench-cache-batches-0", _bench("cache", "--batches", "0"), 2, "argument --batches"),
    Case("bench-dlrm-steps-0", _bench("dlrm", "--steps", "0"), 2, "argument --steps"),
    Case("bench-planner-repeats-0", _bench("planner", "--repeats", "0"), 2, "argument --repeats"),
    Case("bench-contention-steps-0", _bench("contention", "--steps", "0"), 2, "argument --steps"),
    Case("demo-nproc-0", ("demo", "--nproc", "0", "--out", "{tmp}/demo"), 2, "--nproc", absent=("{tmp}/demo",)),
    Case("demo-nproc-past-nodes", ("demo", "--nodes", "8", "--classes", "2", "--nproc", "9", "--out", "{tmp}/demo"),
         2, "--nproc", absent=("{tmp}/demo",)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_traceback(case_inputs, tmp_path, case):
    run_case(case, case_inputs, tmp_path, "TRACEBACK")
    assert not (tmp_path / "r.json").exists()


@pytest.mark.slow
def test_a_dlrm_batch_smaller_than_k_is_one_line(tmp_path):
    """`train dlrm --batch-size 1 --nproc 2`: each rank needs a row of every batch; refused before training."""
    argv = [*DLRM[:9], "--batch-size", "1", *DLRM[11:], "--nproc", "2"]
    proc = subprocess.run([sys.executable, "-m", "haloflow", *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "batch_size 1 is smaller than the 2 ranks" in proc.stderr.strip().splitlines()[-1]


def test_a_one_event_stream_exits_2_every_time_without_an_abort(tmp_path):
    """A stream of one event is refused in one line, and the process then exits 2: before Arrow's reader threads
    were kept to large files, about one exit in three aborted (SIGABRT, "terminate called without an active
    exception") right after the line. Five fresh processes, as a user would start them."""
    (tmp_path / "one.csv").write_text("u,i,ts,label\n0,1,1.0,0\n")
    for _ in range(5):
        proc = subprocess.run([sys.executable, "-m", "haloflow", "train", "tgn", "--events", str(tmp_path / "one.csv"),
                               "--device", "cpu"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and "terminate called" not in proc.stderr, (proc.returncode, proc.stderr)
        assert "chronological_split of 1 events" in proc.stderr
