"""The cpu_scaling part: TGN's per-K summary from hand-built rank rows (its dry run on a CPU is part of
tests/bench/device/test_check.py)."""

import pytest

from haloflow.bench.device.cpu_scaling import tgn_summary


def _rank(overlap, wait_first, fetch_s, sample_s, got, want, events_per_s):
    return {"overlap": overlap, "wait_first": wait_first, "fetch_s": fetch_s, "sample_s": sample_s, "bytes": got,
            "bytes_predicted": want, "events_per_s": events_per_s}


def test_tgn_summary_takes_the_slowest_rank_and_sums_the_bytes():
    per_rank = [_rank(0.010, 0.012, 0.004, 0.002, [100, 200], [100, 200], 900.0),
                _rank(0.011, 0.013, 0.003, 0.005, [300, 400], [300, 400], 800.0)]
    row, record = tgn_summary(2, per_rank)
    # slowest: overlapped 11 ms, control 13 ms, fetch 4 ms, sampling 5 ms -> overlap (13 - 11) / min(4, 5)
    assert record["overlap_ratio"] == pytest.approx(0.5)
    assert record["bytes_per_batch"] == [400, 600] and record["bytes_match"] is True
    assert row[0] == 2 and row[1] == 800.0 and row[2:6] == pytest.approx([13, 11, 4, 5])
    assert row[7] == pytest.approx(500 / 2) and row[8] is True and row[9] == "ok"


def test_tgn_summary_flags_bytes_that_differ_from_the_prediction():
    per_rank = [_rank(0.01, 0.01, 0.0, 0.0, [100], [108], 1.0)]
    row, record = tgn_summary(1, per_rank)
    assert record["bytes_match"] is False and row[-1] == "bytes"
    assert record["overlap_ratio"] is None  # nothing hideable: no ratio
