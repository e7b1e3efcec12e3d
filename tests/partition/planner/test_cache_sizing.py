import numpy as np
import pytest

from haloflow.cache import LRUPolicy, simulate
from haloflow.errors import ConfigError
from haloflow.partition.planner.cache_sizing import folder_traces, with_cache_curves
from haloflow.partition.planner.types import TableSpec


def test_curves_count_hits_as_the_cache_does_on_a_hand_built_trace():
    # 10 rows, LRU. 2 slots (fraction 0.2): [0 1] miss miss, [0 1] hit hit, [2 3] evicts both, [0 1] miss miss:
    # 2 hits in 8 lookups. 5 slots (0.5): only the first use of each row misses: 4 hits in 8.
    trace = [np.array([0, 1]), np.array([1, 0, 0]), np.array([2, 3]), np.array([0, 1])]
    spec = TableSpec(name="t", num_rows=10, dim=4)
    (got,) = with_cache_curves([spec], [trace], fractions=(0.2, 0.5, 1.0 - 1e-9))
    assert got.cache_curve == ((2, 0.25), (5, 0.5))  # ceil(0.9999999999 x 10) = 10 rows: no cache, left out
    assert got.cache_curve[0][1] == simulate(trace, 2, LRUPolicy(), num_rows=10).hit_rate
    assert spec.cache_curve is None  # the input is left as it was


def test_tables_without_a_size_or_a_trace_keep_no_curve_and_mistakes_are_named():
    one_row, no_trace = TableSpec(name="a", num_rows=1, dim=4), TableSpec(name="b", num_rows=50, dim=4)
    assert with_cache_curves([one_row, no_trace], [[np.array([0])], []]) == (one_row, no_trace)
    with pytest.raises(ConfigError, match="1 traces for 2 tables"):
        with_cache_curves([one_row, no_trace], [[]])
    with pytest.raises(ConfigError, match=r"policy 'frequency' needs id_frequencies with one bin per row \(50\)"):
        with_cache_curves([no_trace], [[np.array([1, 2])]], policy="frequency")


def test_traces_of_a_preprocessed_folder(shared_data, tmp_path):
    from haloflow.data.criteo import CriteoPreprocessConfig, preprocess_criteo

    raw = shared_data / "criteo" / "criteo_kaggle_train_head1000.txt"
    preprocess_criteo(CriteoPreprocessConfig(raw=(raw,), out=tmp_path / "c", layout="kaggle", row_group_size=100))
    traces = folder_traces(tmp_path / "c", batch_size=64, max_batches=3)
    assert len(traces) == 26 and all(len(t) == 3 and t[0].size == 64 for t in traces)  # one id per sample
