import pytest

from haloflow.utils.table import format_table


def test_alignment_and_number_formats():
    text = format_table(["part", "name", "ratio"], [[0, "a", 0.5], [12345, "bcd", None]], float_fmt=".2f", title="T")
    assert text.splitlines() == [
        "T",
        "  part  name  ratio",
        "------  ----  -----",
        "     0  a      0.50",
        "12,345  bcd       -",
    ]


def test_row_length_is_checked():
    with pytest.raises(ValueError, match="row 1 has 1 cells, expected 2"):
        format_table(["a", "b"], [[1, 2], [3]])


def test_one_float_format_per_column():
    text = format_table(["a", "b"], [[1.5, 1.5]], float_fmt=[".1f", ".3f"])
    assert text.splitlines()[2] == "1.5  1.500"
    with pytest.raises(ValueError, match="float_fmt has 1 specs, expected one per header"):
        format_table(["a", "b"], [[1.0, 2.0]], float_fmt=[".1f"])
