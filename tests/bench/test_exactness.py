"""bench exactness: its argument checks, and a tiny real run (the table and the JSON's shape; no timings are
asserted)."""

import json

import pytest

from haloflow.bench.exactness import main


@pytest.mark.parametrize("argv, message", [
    (["--ks", "3"], "each K must host V = 4"),
    (["--ks", "abc"], "--ks"),
    (["--families", "gat"], "--families"),
    (["--rounds", "0"], "--rounds"),
    (["--units", "1"], "--units"),
])
def test_bad_arguments_stop_before_any_run(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main([*argv, "--families", "dlrm", "--out", str(tmp_path / "x.json")] if "--families" not in argv
             else [*argv, "--out", str(tmp_path / "x.json")])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_one_round_of_dlrm_at_k_1_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "exactness.json"
    assert main(["--families", "dlrm", "--ks", "1", "--rounds", "1", "--units", "20", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "new/old (median)" in printed and "dlrm" in printed
    (cell,) = json.loads(out.read_text())["results"]
    assert cell["family"] == "dlrm" and cell["k"] == 1 and cell["v"] == 4 and cell["unit"] == "step"
    assert cell["old_s_per_unit"] > 0 and cell["new_s_per_unit"] > 0 and len(cell["ratios"]) == 1
    assert cell["old_bytes_per_unit"] == cell["new_bytes_per_unit"] == 0  # one process sends nothing
