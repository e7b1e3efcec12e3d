import json

import numpy as np
import pytest

from haloflow.data.clicks import ClickLogConfig, ClickLogGenerator
from haloflow.errors import ConfigError, InputFormatError
from haloflow.data.criteo import KAGGLE_TABLE_SIZES
from haloflow.partition.planner.specs import fold_histogram, kaggle_tables, load_table_specs, parse_bytes


def test_parse_bytes():
    assert parse_bytes("2GiB") == 2 * 2**30
    assert parse_bytes("1.5 GB") == 1.5e9
    assert parse_bytes("512mib") == 512 * 2**20
    assert parse_bytes("4096") == 4096
    with pytest.raises(ConfigError, match="--mem: cannot read '2 gigs'"):
        parse_bytes("2 gigs", "--mem")


def test_kaggle_spec_has_the_26_cardinalities():
    specs = kaggle_tables()
    assert [s.num_rows for s in specs] == list(KAGGLE_TABLE_SIZES) and sum(KAGGLE_TABLE_SIZES) == 33_762_577
    assert {s.dim for s in specs} == {16} and specs[0].name == "C1"


def test_json_with_histogram_and_defaults(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"name": "a", "num_rows": 10, "id_frequencies": [3, 1]},
                                {"name": "b", "num_rows": 7, "dim": 8, "pooling_factor": 2.5}]))
    a, b = load_table_specs(path, dim=4)
    assert (a.dim, a.pooling_factor, b.dim, b.pooling_factor) == (4, 1.0, 8, 2.5)
    np.testing.assert_array_equal(a.id_frequencies, [3.0, 1.0])


@pytest.mark.parametrize("name, text, match", [
    ("t.json", '[{"name": "a", "num_rows": 10, "rows": 3}]', r"t\.json: tables\[0\]: unknown fields \['rows'\]"),
    ("t.json", '[{"name": "a", "num_rows": -1}]', r"t\.json: tables\[0\]: table a: num_rows must be an integer >= 1"),
    ("t.json", '{"tables": []}', "expected a non-empty list of tables"),
    ("t.json", '{"tables": [1, 2', r"t\.json:1: not valid JSON"),
    ("t.csv", "name,num_rows,dim\na,10,4\nb,7\n", r"t\.csv:3: 2 fields, expected 3"),
    ("t.csv", "table,rows\n", r"t\.csv:1: header \['table', 'rows'\] lacks name and num_rows"),
    ("t.txt", "a", r"unknown tables file type '\.txt'"),
])
def test_bad_files_name_file_line_and_field(tmp_path, name, text, match):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InputFormatError, match=match):
        load_table_specs(path)


def test_preprocessed_folder_gives_sizes_pooling_and_histograms(tmp_path):
    sizes = (50, 3000, 7)
    ClickLogGenerator(ClickLogConfig(table_sizes=sizes, seed=0)).write_parquet(tmp_path / "clicks", {"train": 400})
    specs = load_table_specs(tmp_path / "clicks")
    assert [s.num_rows for s in specs] == list(sizes) and [s.name for s in specs] == ["C1", "C2", "C3"]
    for s in specs:  # one id per row per table: 400 lookups in all
        assert s.pooling_factor == 1.0 and s.id_frequencies.sum() == 400
    assert specs[1].id_frequencies.size == 3000
    assert load_table_specs(tmp_path / "clicks", max_bins=64)[1].id_frequencies.size == 64


def test_fold_histogram_bins():
    np.testing.assert_array_equal(fold_histogram(np.arange(10), 3), [0 + 1 + 2, 3 + 4 + 5, 6 + 7 + 8 + 9])
