import bz2
import gzip
import lzma

import numpy as np
import pytest

from haloflow.data.textscan import iter_token_blocks, open_decompressed, read_head, read_int_rows, scan_int_rows
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


# A table as users hold them: comments of two kinds, a header line, a third field that is never parsed.
LOOSE_TEXT = "% konect-style\n# snap-style\n\nsource,target,weight\n0,1,0.5\n% mid\n2 3 -1\n4\t5\t1e9\n"


def test_scan_int_rows_header_and_ignored_fields_at_any_block_size(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text(LOOSE_TEXT)
    for block_bytes in (1, 7, 30, 1 << 20):  # the header and the first data line in different blocks, or not
        rows = scan_int_rows(path, 2, comment="#%", header=True, max_fields=4, block_bytes=block_bytes)
        np.testing.assert_array_equal(rows.values, [[0, 1], [2, 3], [4, 5]])
        assert (rows.header, rows.header_line, rows.num_fields) == (("source", "target", "weight"), 4, 3)
        assert rows.ignored == ("weight",)
    no_header = tmp_path / "n.txt"
    no_header.write_text("0 1 7 1217567877\n1 2 8 1217567878\n")
    rows = scan_int_rows(no_header, 2, header=True, max_fields=4)
    assert rows.header is None and rows.ignored == ("column 3", "column 4")
    np.testing.assert_array_equal(rows.values, [[0, 1], [1, 2]])


@pytest.mark.parametrize(
    "text, line, match",
    [
        ("1 2 7\n1 2\n", 2, r"expected 3 fields \(a b \+ 1 ignored\) .* found 2: '1 2' \(the first data line, line 1, "
                            r"has 3; every line must have as many\)"),
        ("a b w\n1 2\n", 2, r"expected 3 fields \(a b w\) .* found 2: '1 2' \(the header, line 1, has 3"),
        ("1 2 2 3 4\n", 1, r"expected 2 to 4 fields \(a b, then ignored ones\) .* found 5"),
        ("nodes\n1 2\n", 1, r"header 'nodes' names 1 column: expected 2 to 4 fields"),
        ("1 2\na b\n", 2, "non-integer token 'a'"),  # a header only as the first line
        ("-1 x\n", 1, "negative id -1"),  # '-1' holds no letter: not a header
        ("0 3\n", 1, r"id 0 is out of range: expected ids in 1\.\.2 \(line '0 3'\); why"),
    ],
)
def test_scan_int_rows_errors(tmp_path, text, line, match):
    path = tmp_path / "t.txt"
    path.write_text(text)
    with pytest.raises(InputFormatError, match=f"t.txt:{line}: .*{match}"):
        scan_int_rows(path, 2, columns="a b", header=True, max_fields=4, lower=1, upper=3, range_hint="why")


@pytest.mark.parametrize("codec", ["gz", "xz", "bz2"])
def test_truncated_compressed_file_is_an_input_error(tmp_path, codec):
    compress = {"gz": gzip.compress, "xz": lzma.compress, "bz2": bz2.compress}[codec]
    data = compress("".join(f"{i} {i + 1}\n" for i in range(50_000)).encode())
    path = tmp_path / f"t.txt.{codec}"
    path.write_bytes(data[: len(data) // 2])
    name = {"gz": "gzip"}.get(codec, codec)
    with pytest.raises(InputFormatError, match=f"t.txt.{codec}: truncated or corrupt {name} data .*: expected a "
                                               f"complete {name} file"):
        read_int_rows(path, 2, block_bytes=1 << 12)
    garbage = tmp_path / "g.txt"
    garbage.write_bytes(data[:6] + b"not compressed data" * 10)  # the magic number, then junk
    with pytest.raises(InputFormatError, match=f"g.txt: truncated or corrupt {name} data"):
        read_head(garbage, 4096)
    with pytest.raises(InputFormatError, match=f"g.txt: truncated or corrupt {name} data"):
        read_int_rows(garbage, 2)
