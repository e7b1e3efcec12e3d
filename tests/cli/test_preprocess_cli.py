import gzip
import json

import pytest

from haloflow.cli import main

HEAD = "criteo/criteo_kaggle_train_head1000.txt"


def test_criteo_from_the_command_line(shared_data, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["preprocess", "criteo", str(shared_data / HEAD), "--out", str(out), "--max-ind-range", "1000"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "train" in printed and "858" in printed  # 6/7 of 1000 lines
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["options"]["max_ind_range"] == 1000 and meta["table_sizes"] == [1000] * 26


def test_clicks_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "syn"
    rc = main(["preprocess", "clicks", "--out", str(out), "--train", "100", "--val", "10", "--test", "10",
               "--scale", "0.0001"])  # fmt: skip
    assert rc == 0
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["splits"]["train"]["rows"] == 100


def _bad(tmp_path):
    raw = tmp_path / "bad.txt"
    raw.write_text("0\t1\n")
    return raw


@pytest.mark.parametrize(
    "args, message",
    [
        (["criteo", "{tmp}/missing.txt", "--out", "{tmp}/o"], "missing.txt does not exist"),
        (["criteo", "{bad}", "--out", "{tmp}/o", "--strict"], "bad.txt:1: expected 40 tab-separated fields"),
        (["criteo", "{bad}", "--out", "{tmp}/o", "--max-ind-range", "5", "--frequency-threshold", "2"], "not both"),
        (["criteo", "{bad}", "--out", "{tmp}/o", "--max-ind-range", "0"], "--max-ind-range must be >= 1, got 0"),
        (["criteo", "{bad}", "--out", "{tmp}", "--max-ind-range", "3"], "already exists"),
        (["clicks", "--out", "{tmp}/o", "--scale", "-1"], "scale must be a finite number > 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    bad = _bad(tmp_path)
    argv = ["preprocess"] + [a.format(tmp=tmp_path, bad=bad) for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "o").exists()


def test_inputs_that_are_not_criteo_are_one_line_and_nothing_written(cli_fails, shared_data, tmp_path):
    out = tmp_path / "o"
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    cli_fails(["preprocess", "criteo", empty, "--out", out], "empty.txt: empty file")
    blob = tmp_path / "blob.bin"
    blob.write_bytes(bytes(range(256)) * 40)
    cli_fails(["preprocess", "criteo", blob, "--out", out], "blob.bin: binary data, not text")
    head = (shared_data / HEAD).read_bytes()
    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes(gzip.compress(head)[:5000])
    cli_fails(["preprocess", "criteo", cut, "--out", out], "cut.txt.gz: cannot be read", "truncated or corrupt")
    graph = tmp_path / "graph.txt"
    graph.write_text("0\t1\n1\t2\n2\t0\n")
    cli_fails(["preprocess", "criteo", graph, "--out", out, "--max-ind-range", "9"],
              "graph.txt: all 3 lines were rejected", "the first, line 1: expected 40 tab-separated fields")
    cli_fails(["preprocess", "criteo", shared_data / HEAD, shared_data / HEAD, "--out", out], "is given twice")
    for target in (graph / "sub", graph / "a" / "b"):
        cli_fails(["preprocess", "criteo", shared_data / HEAD, "--out", target], f"{graph} is a file")
        cli_fails(["preprocess", "clicks", "--out", target], f"{graph} is a file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blob.bin", "cut.txt.gz", "empty.txt", "graph.txt"]
