import bz2
import gzip
import json
import lzma
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from haloflow.data.criteo import CriteoPreprocessConfig, preprocess_criteo
from haloflow.data.criteo_loader import ClickLoader, ClickLoaderConfig
from haloflow.errors import ConfigError, InputFormatError

HEAD = "criteo/criteo_kaggle_train_head1000.txt"


def _fields(line: str) -> list[str]:
    """A raw line padded to its 40 fields (the head has trailing empty fields stripped)."""
    f = line.rstrip("\n").split("\t")
    return f + [""] * (40 - len(f))


def _expected_dense(fields: list[str]) -> list[float]:
    return [float(np.float32(math.log1p(max(int(x), 0)))) if x else 0.0 for x in fields[1:14]]


def _split_sizes(n: int) -> dict[str, int]:
    """Kaggle split by an independent route: 7 near-equal parts, the 7th halved into test then val."""
    parts = np.array_split(np.arange(n), 7)
    test, val = np.array_split(parts[6], 2)
    return {"train": sum(len(p) for p in parts[:6]), "test": len(test), "val": len(val)}


def _load_split(out: Path, split: str):
    batches = list(ClickLoader(out, ClickLoaderConfig(batch_size=64, split=split)))
    dense = torch.cat([b.dense for b in batches])
    ids = torch.cat([b.sparse.values.view(26, -1).t() for b in batches])  # (n, 26)
    labels = torch.cat([b.labels for b in batches])
    return dense, ids, labels


@pytest.fixture(scope="module")
def head_out(shared_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("criteo") / "threshold"
    summary = preprocess_criteo(CriteoPreprocessConfig(raw=(shared_data / HEAD,), out=out, row_group_size=100))
    return summary, out, (shared_data / HEAD).read_text().splitlines()


def test_real_head_rows_splits_and_hand_checked_values(head_out):
    summary, out, lines = head_out
    assert summary.lines == len(lines) == 1000 and summary.bad_rows == 0
    assert summary.rows == _split_sizes(1000)
    meta = json.loads((out / "metadata.json").read_text())
    assert {s: meta["splits"][s]["rows"] for s in ("train", "val", "test")} == _split_sizes(1000)
    dense, ids, labels = _load_split(out, "train")
    assert len(labels) == summary.rows["train"]

    # Threshold mode with min_count 1: ids by descending count over all lines, ties by integer value.
    columns = [[_fields(line)[14 + j] for line in lines] for j in range(26)]
    expected_ids = []
    for col in columns:
        counts = Counter(int(v, 16) for v in col if v)
        order = sorted(counts, key=lambda v: (-counts[v], v))
        expected_ids.append({v: i + 1 for i, v in enumerate(order)})
    for row in (0, 1, 2, 500):  # rows of train are the first lines, in order
        fields = _fields(lines[row])
        assert labels[row].item() == float(fields[0])
        assert dense[row].tolist() == _expected_dense(fields)
        want = [expected_ids[j][int(x, 16)] if x else 0 for j, x in enumerate(fields[14:])]
        assert ids[row].tolist() == want
    assert meta["table_sizes"] == [len(m) + 1 for m in expected_ids]
    # a stripped trailing field is a missing value: line 1's C22 field is empty
    assert _fields(lines[0])[14 + 21] == "" and ids[0, 21].item() == 0


def test_test_and_val_are_the_halves_of_the_last_seventh(head_out):
    summary, out, lines = head_out
    _, _, labels = _load_split(out, "test")
    start = summary.rows["train"]
    want = [float(_fields(line)[0]) for line in lines[start : start + summary.rows["test"]]]
    assert labels.tolist() == want
    dense, _, _ = _load_split(out, "val")
    assert dense[-1].tolist() == _expected_dense(_fields(lines[-1]))


def test_modulo_mode_one_pass(shared_data, tmp_path):
    out = tmp_path / "mod"
    summary = preprocess_criteo(CriteoPreprocessConfig(raw=(shared_data / HEAD,), out=out, max_ind_range=97))
    assert summary.table_sizes == [97] * 26 and summary.mode == "modulo"
    _, ids, _ = _load_split(out, "train")
    lines = (shared_data / HEAD).read_text().splitlines()
    for row in (0, 7):
        want = [int(x, 16) % 97 if x else 0 for x in _fields(lines[row])[14:]]
        assert ids[row].tolist() == want


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _good_line(rng, label: int = 0) -> str:
    dense = [str(int(v)) if v >= 0 else "" for v in rng.integers(-3, 50, 13)]
    cats = [f"{v:08x}" for v in rng.integers(0, 6, 26)]
    return "\t".join([str(label), *dense, *cats])


def _with_field(line: str, index: int, value: str) -> str:
    fields = line.split("\t")
    fields[index] = value
    return "\t".join(fields)


def test_frequency_threshold_maps_rare_values_to_zero(tmp_path, rng):
    lines = [_good_line(rng) for _ in range(40)]
    out = tmp_path / "t"
    summary = preprocess_criteo(CriteoPreprocessConfig(raw=(_write(tmp_path / "r.txt", lines),), out=out, min_count=8))
    _, ids, _ = _load_split(out, "train")
    for j in range(26):
        counts = Counter(int(_fields(line)[14 + j], 16) for line in lines)
        kept = sorted((v for v in counts if counts[v] >= 8), key=lambda v: (-counts[v], v))
        assert summary.table_sizes[j] == len(kept) + 1
        want = [kept.index(int(_fields(line)[14 + j], 16)) + 1 if counts[int(_fields(line)[14 + j], 16)] >= 8 else 0
                for line in lines[: len(ids)]]  # fmt: skip
        assert ids[:, j].tolist() == want


def test_bad_rows_are_counted_with_line_numbers(tmp_path, rng):
    lines = [_good_line(rng) for _ in range(12)]
    lines[1] = lines[1].replace("\t", "\x1f", 1)  # line 2: a control byte the reader cannot take
    lines[2] = lines[2] + "\textra"  # line 3: 41 fields
    lines[4] = _with_field(lines[4], 18, "zzzz0000")  # line 5: C5 not hex
    lines[6] = "1\t2\t3"  # line 7: 3 fields
    lines[8] = "\t".join(lines[8].split("\t")[:38])  # line 9: trailing fields stripped -> fine
    lines[10] = ""  # line 11: empty
    raw = _write(tmp_path / "bad.txt", lines)
    summary = preprocess_criteo(CriteoPreprocessConfig(raw=(raw,), out=tmp_path / "o", max_reported=4))
    assert summary.bad_rows == 5
    assert [b.line for b in summary.first_bad] == [2, 3, 5, 7]
    assert "0x1f" in summary.first_bad[0].reason
    assert "found 41" in summary.first_bad[1].reason
    assert "C5 must be a hex string" in summary.first_bad[2].reason and "zzzz0000" in summary.first_bad[2].reason
    assert sum(summary.rows.values()) == 12 - 5
    meta = json.loads((tmp_path / "o" / "metadata.json").read_text())
    assert meta["bad_rows"]["count"] == 5 and meta["bad_rows"]["first"][3]["line"] == 7
    _, _, labels = _load_split(tmp_path / "o", "train")  # the good lines after the skipped one are all there
    assert labels.tolist() == [float(lines[i][0]) for i in (0, 3, 5, 7, 8, 9)]
    assert "bad.txt:3" in summary.table()


def test_strict_fails_on_the_first_bad_row_and_writes_nothing(tmp_path, rng):
    lines = [_good_line(rng) for _ in range(5)]
    lines[3] = _with_field(lines[3], 3, "x7")  # line 4: I3 not an integer
    raw = _write(tmp_path / "bad.txt", lines)
    with pytest.raises(InputFormatError, match=r"bad\.txt:4: I3 must be an integer, found 'x7'"):
        preprocess_criteo(CriteoPreprocessConfig(raw=(raw,), out=tmp_path / "o", strict=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt"]  # no output, no temporary folder


def test_seven_way_split_sizes_by_line_position(tmp_path, rng):
    lines = [_good_line(rng, label=i % 2) for i in range(23)]
    summary = preprocess_criteo(CriteoPreprocessConfig(raw=(_write(tmp_path / "r.txt", lines),), out=tmp_path / "o"))
    assert summary.rows == _split_sizes(23) == {"train": 20, "test": 2, "val": 1}


def test_day_files_last_day_is_test_then_val_and_gzip_is_read(tmp_path, rng):
    days = {}
    for d, n in ((0, 5), (1, 4), (2, 7)):
        lines = [_good_line(rng) for _ in range(n)]
        days[d] = lines
        with gzip.open(tmp_path / f"day_{d}.gz", "wt") as f:
            f.write("".join(line + "\n" for line in lines))
    raws = tuple(tmp_path / f"day_{d}.gz" for d in (2, 0, 1))  # order given does not matter
    summary = preprocess_criteo(CriteoPreprocessConfig(raw=raws, out=tmp_path / "o", max_ind_range=1000))
    assert summary.layout == "days" and summary.rows == {"train": 9, "test": 4, "val": 3}
    dense, _, _ = _load_split(tmp_path / "o", "val")
    assert dense.tolist() == [_expected_dense(_fields(line)) for line in days[2][4:]]


def _as_csv(lines: list[str], id_column: bool = False) -> str:
    """The lines as a Kaggle-sample CSV: a header, commas, integers written as floats, CRLF, maybe an Id column."""
    names = ["Label"] + [f"I{j}" for j in range(1, 14)] + [f"C{j}" for j in range(1, 27)]
    rows = [["Id"] * id_column + names]
    for k, line in enumerate(lines):
        fields = [f + ".0" if 1 <= j <= 13 and f else f for j, f in enumerate(line.split("\t"))]
        rows.append([str(1000 + k)] * id_column + fields)
    return "".join(",".join(r) + "\r\n" for r in rows)


@pytest.mark.parametrize("id_column", [False, True])
def test_csv_with_a_header_reads_like_the_tsv(tmp_path, rng, id_column):
    lines = [_good_line(rng, label=i % 2) for i in range(30)]
    lines[4] = "\t".join(lines[4].split("\t")[:38])  # trailing fields stripped, as in the real head
    tsv = _write(tmp_path / "r.txt", lines)
    csv = tmp_path / "r.csv"
    csv.write_text(_as_csv(lines, id_column))
    want = preprocess_criteo(CriteoPreprocessConfig(raw=(tsv,), out=tmp_path / "tsv"))
    got = preprocess_criteo(CriteoPreprocessConfig(raw=(csv,), out=tmp_path / "csv"))
    assert got.lines == 30 and got.bad_rows == 0 and got.rows == want.rows  # the header is not a line of data
    assert got.table_sizes == want.table_sizes
    for split in ("train", "test", "val"):
        for a, b in zip(_load_split(tmp_path / "tsv", split), _load_split(tmp_path / "csv", split)):
            assert torch.equal(a, b)


@pytest.mark.parametrize("suffix, compress", [(".gz", gzip.compress), (".bz2", bz2.compress), (".xz", lzma.compress)])
def test_compressed_inputs_read_like_plain_text(tmp_path, rng, suffix, compress):
    lines = [_good_line(rng, label=i % 2) for i in range(20)]
    plain = _write(tmp_path / "r.txt", lines)
    packed = tmp_path / f"r.txt{suffix}"
    packed.write_bytes(compress(plain.read_bytes()))
    want = preprocess_criteo(CriteoPreprocessConfig(raw=(plain,), out=tmp_path / "plain"))
    got = preprocess_criteo(CriteoPreprocessConfig(raw=(packed,), out=tmp_path / "packed"))
    assert (got.rows, got.table_sizes, got.bad_rows) == (want.rows, want.table_sizes, 0)
    for a, b in zip(_load_split(tmp_path / "plain", "train"), _load_split(tmp_path / "packed", "train")):
        assert torch.equal(a, b)


def _truncated_gz(tmp_path, rng) -> Path:
    data = gzip.compress("".join(_good_line(rng) + "\n" for _ in range(2000)).encode())
    path = tmp_path / "cut.txt.gz"
    path.write_bytes(data[: len(data) // 2])
    return path


@pytest.mark.parametrize(
    "name, content, match",
    [
        ("empty.txt", b"", r"empty.txt: empty file: expected Criteo lines \(a 0/1 label, 13 integer and 26 hex"),
        ("blob.bin", bytes(range(256)) * 4, r"blob.bin: binary data, not text \(byte 0x00 at offset 0\)"),
        ("day.txt", gzip.compress(b"0\t1\n", mtime=0), r"day.txt: compressed data in a file not named \*.gz"),
        ("head.csv", b"label,I1,I2\n", "head.csv: a header line and no data lines"),
        ("graph.txt", b"# a graph\n0\t1\n1\t2\n", r"graph.txt: all 3 lines were rejected, so the file adds no rows "
         r"\(read as tab-separated\); the first, line 1: expected 40 tab-separated fields .* found 1"),
        ("g.csv", b"src,dst\n0,1\n", r"all 1 lines were rejected, .*a header line\); the first, line 2: expected "
         r"40 ','-separated fields"),
        ("cut.txt.gz", None, r"cut.txt.gz: cannot be read( after line [0-9,]+)? \(OSError: .*\): expected complete "
         r"Criteo text"),
    ],
)
@pytest.mark.parametrize("mode", [{}, {"max_ind_range": 10}])
def test_unreadable_or_useless_inputs_name_the_file_and_write_nothing(tmp_path, rng, name, content, match, mode):
    good = _write(tmp_path / "good.txt", [_good_line(rng) for _ in range(20)])
    bad = _truncated_gz(tmp_path, rng) if content is None else tmp_path / name
    if content is not None:
        bad.write_bytes(content)
    config = CriteoPreprocessConfig(raw=(good, bad), out=tmp_path / "o", block_size=1 << 16, **mode)
    with pytest.raises(InputFormatError, match=match):
        preprocess_criteo(config)
    assert not any(p.name.startswith((".o", "o")) for p in tmp_path.iterdir())  # no output, no temporary folder


def test_config_errors(tmp_path):
    raw = _write(tmp_path / "r.txt", ["0" + "\t" * 39])
    with pytest.raises(ConfigError, match="either --frequency-threshold"):
        CriteoPreprocessConfig(raw=(raw,), out=tmp_path / "o", min_count=2, max_ind_range=10)
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        CriteoPreprocessConfig(raw=(tmp_path / "nope.txt",), out=tmp_path / "o")
    with pytest.raises(ConfigError, match="--layout days needs >= 2 inputs named day_<N>"):
        CriteoPreprocessConfig(raw=(raw,), out=tmp_path / "o", layout="days")
    (tmp_path / "o").mkdir()
    with pytest.raises(ConfigError, match="already exists"):
        preprocess_criteo(CriteoPreprocessConfig(raw=(raw,), out=tmp_path / "o"))
    other, again = _write(tmp_path / "other.txt", ["0"]), tmp_path / "o" / ".." / "r.txt"
    with pytest.raises(ConfigError, match=r"o/../r.txt is given twice \(inputs 1 and 3, as .*r.txt\): expected each"):
        CriteoPreprocessConfig(raw=(raw, other, again), out=tmp_path / "p")
    (tmp_path / "link.txt").symlink_to(raw)
    with pytest.raises(ConfigError, match=r"link.txt is given twice \(inputs 1 and 2, as .*r.txt\)"):
        CriteoPreprocessConfig(raw=(raw, tmp_path / "link.txt"), out=tmp_path / "p")
    with pytest.raises(ConfigError, match=r"cannot create .*r.txt/out: .*r.txt is a file, expected a folder"):
        CriteoPreprocessConfig(raw=(raw,), out=raw / "out")


def test_output_row_groups_follow_the_option(head_out):
    summary, out, _ = head_out
    pf = pq.ParquetFile(out / "train.parquet")
    assert pf.metadata.num_row_groups == math.ceil(summary.rows["train"] / 100)
    assert pf.metadata.row_group(0).num_rows == 100
