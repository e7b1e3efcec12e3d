import gzip

import numpy as np
import pytest

from haloflow.data.textscan import iter_token_blocks, open_decompressed, read_int_rows
from haloflow.errors import InputFormatError


def make_table(rng, rows: int) -> tuple[np.ndarray, str]:
    """Random 2-column table and its text with random separators, comments and blank lines."""
    values = rng.integers(0, 10 ** rng.integers(1, 12, size=(rows, 2)), dtype=np.int64)  # 1 to 11 digits
    seps = [" ", "\t", ",", "  ", " \t "]
    lines = []
    for a, b in values:
        if rng.random() < 0.2:
            lines.append("# comment 1 2 x")
        if rng.random() < 0.1:
            lines.append("")
        lines.append(f"{a}{seps[rng.integers(len(seps))]}{b}" + ("\r" if rng.random() < 0.5 else ""))
    return values, "\n".join(lines) + "\n"


def test_read_int_rows_is_independent_of_block_size(tmp_path, rng):
    values, text = make_table(rng, 300)
    path = tmp_path / "t.txt.gz"
    path.write_bytes(gzip.compress(text.encode()))
    for block_bytes in (1, 7, 64, 1000, 1 << 20):  # 1 byte: every line is longer than a block
        got = read_int_rows(path, 2, block_bytes=block_bytes)
        np.testing.assert_array_equal(got, values)


def test_error_line_numbers_are_exact_across_blocks(tmp_path, rng):
    _, text = make_table(rng, 200)
    lines = text.split("\n")
    lines.insert(150, "12 oops")
    path = tmp_path / "t.txt"
    path.write_text("\n".join(lines))
    for block_bytes in (5, 100, 1 << 20):
        with pytest.raises(InputFormatError, match=f"{path}:151: non-integer token 'oops'") as info:
            read_int_rows(path, 2, block_bytes=block_bytes)
        assert info.value.line == 151


def test_read_int_rows_options(tmp_path):
    path = tmp_path / "ids.txt"
    path.write_text("4\n#1\n7\n")
    with pytest.raises(InputFormatError, match="ids.txt:2: non-integer token '#1': expected an integer year"):
        read_int_rows(path, 1, comment=None, what="year")
    np.testing.assert_array_equal(read_int_rows(path, 1)[:, 0], [4, 7])
    with pytest.raises(InputFormatError, match=r"ids.txt:3: node id 7 is out of range: expected node ids in \[0, 5\)"):
        read_int_rows(path, 1, what="node id", upper=5)
    with pytest.raises(InputFormatError, match=r"ids.txt:1: expected 3 fields \(a b c\) .* found 1: '4'"):
        read_int_rows(path, 3, columns="a b c")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert read_int_rows(empty, 2).shape == (0, 2)


def test_tokens_carry_file_line_numbers(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"# c\r\n0\t1\r\n\r\n2,3\n")
    (tb,) = list(iter_token_blocks(path))
    assert [tb.token_text(i) for i in range(len(tb.start))] == ["#", "c", "0", "1", "2", "3"]
    np.testing.assert_array_equal(tb.line, [1, 1, 2, 2, 4, 4])
    np.testing.assert_array_equal(tb.line_count, [2, 2, 2])
    assert tb.line_text(2) == "0\t1"


def test_open_decompressed_rejects_a_folder(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a folder, expected a file"):
        open_decompressed(tmp_path)
