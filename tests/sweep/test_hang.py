"""HANG: a command that ran for minutes (or forever) on a value it should have refused at once (issue 37): a count
of units past what any run could finish, and ``bench partition-ooc`` with a budget it cannot read, which ran its
7.5 GiB default job. Each case now ends at once with one line and exit 2."""

from __future__ import annotations

import time

import pytest

from tests.sweep.cases import DLRM, GCN, TGN, Case, run_case

pytestmark = pytest.mark.timeout(120)

HUGE = "100000000000000000000"  # 1e20 as an integer
PAST = "2000000000"  # within int64, past MAX_UNITS (a billion units)
_OOC = ("bench", "partition-ooc", "--out", "{tmp}/r.json")

CASES = [
    Case("gcn-epochs-1e20", (*GCN[:5], HUGE, *GCN[6:]), 2, "argument --epochs"),
    Case("gcn-epochs-1e20-float", (*GCN[:5], "1e20", *GCN[6:]), 2, "argument --epochs"),
    Case("gcn-epochs-past-a-run", (*GCN[:5], PAST, *GCN[6:]), 2, "more than a run could finish"),
    Case("dlrm-max-steps-past-a-run", (*DLRM[:12], PAST, *DLRM[13:]), 2, "--max-steps"),
    Case("dlrm-epochs-past-a-run", (*DLRM, "--epochs", PAST), 2, "more than a run could finish"),
    Case("tgn-epochs-past-a-run", (*TGN[:5], PAST, *TGN[6:]), 2, "more than a run could finish"),
    Case("tgn-max-batches-past-a-run", (*TGN[:7], PAST, *TGN[8:]), 2, "more than a run could finish"),
    Case("bench-partition-ooc-budget-abc", (*_OOC, "--budget", "abc"), 2, "argument --budget"),
    Case("bench-partition-ooc-compare-budget-abc", (*_OOC, "--compare-budget", "lots"), 2,
         "argument --compare-budget"),
    Case("bench-partition-ooc-scale-0", (*_OOC, "--scale", "0"), 2, "argument --scale"),
    Case("bench-partition-ooc-scale-huge", (*_OOC, "--scale", "99"), 2, "argument --scale"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hang(case_inputs, tmp_path, case, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a bench that did start would write bench-results/ here, not in the work tree
    t0 = time.perf_counter()
    run_case(case, case_inputs, tmp_path, "HANG")
    assert time.perf_counter() - t0 < 10.0, "refused at once, before any work"
    assert not (tmp_path / "bench-results").exists() and not (tmp_path / "r.json").exists()
