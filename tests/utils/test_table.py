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
