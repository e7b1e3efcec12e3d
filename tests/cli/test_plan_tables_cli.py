import json
import re

import pytest

from haloflow.cli import main
from haloflow.partition.planner.plan_io import load_plan
from haloflow.partition.planner.types import ShardingPlan


def test_kaggle_plan_is_printed_and_written(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan-tables", "--tables", "kaggle", "--world-size", "4", "--memory-per-rank", "1GiB",
                 "--batch-size", "1024", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    plan = load_plan(out)
    assert plan.world_size == 4 and len(plan.tables) == 26
    assert "C3 " in text and "10,131,227" in text
    for c in plan.per_rank:  # one printed line per rank: rank, cost in us, ..., memory
        assert any(line.split()[:2] == [str(c.rank), f"{c.cost * 1e6:.1f}"] for line in text.splitlines())


def test_json_and_csv_table_files(tmp_path, capsys):
    js = tmp_path / "tables.json"
    js.write_text(json.dumps({"tables": [{"name": "users", "num_rows": 5_000_000, "dim": 32, "pooling_factor": 3},
                                         {"name": "ads", "num_rows": 40, "dim": 32}]}))
    cs = tmp_path / "tables.csv"
    cs.write_text("name,num_rows,dim,pooling_factor\nusers,5000000,32,3\nads,40,32,1\n")
    plans = []
    for path in (js, cs):
        out = tmp_path / f"{path.suffix[1:]}.plan.json"
        assert main(["plan-tables", "--tables", str(path), "--world-size", "2", "--memory-per-rank", "1GiB",
                     "--out", str(out)]) == 0
        plans.append(load_plan(out))
    assert plans[0] == plans[1]
    assert [tp.table for tp in plans[0].tables] == ["users", "ads"]
    assert "users" in capsys.readouterr().out


@pytest.mark.parametrize("setup, args, match", [
    (None, ["--tables", "missing.json"], "tables file missing.json not found"),
    ("{\"tables\": [", ["--tables", "{path}"], r"bad\.json:1: not valid JSON"),
    ("name,num_rows\nt0,ten\n", ["--tables", "{path}"], r"bad\.csv:2: num_rows is 'ten', expected an integer"),
    (None, ["--tables", "kaggle", "--world-size", "0"], "--world-size must be an integer >= 1, got 0"),
    (None, ["--tables", "kaggle", "--memory-per-rank", "lots"], "--memory-per-rank: cannot read 'lots'"),
    (None, ["--tables", "kaggle", "--memory-per-rank", "100MiB"], r"table C3 .* does not fit"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, setup, args, match):
    path = tmp_path / ("bad.csv" if setup and setup.startswith("name") else "bad.json")
    if setup is not None:
        path.write_text(setup)
    argv = ["plan-tables", "--world-size", "2", "--memory-per-rank", "1GiB"]
    argv += [a.replace("{path}", str(path)) for a in args]  # later flags win
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("haloflow plan-tables: error: ")
    assert re.search(match, err)


def test_cached_tables_when_the_budget_needs_them(tmp_path, capsys):
    # 2.16 GB of Kaggle tables on one rank with 1 GiB: refused, unless tables may be cached
    args = ["plan-tables", "--tables", "kaggle", "--world-size", "1", "--memory-per-rank", "1GiB"]
    assert main(args) == 2
    assert "does not fit" in capsys.readouterr().err
    out = tmp_path / "plan.json"
    assert main([*args, "--cached", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    plan = load_plan(out)
    cached = {tp.table: tp.cache_rows for tp in plan.tables if tp.cache_rows is not None}
    assert "C3" in cached and 0 < cached["C3"] < 10_131_227
    assert "cache rows" in text and "host memory" in text and f"{cached['C3']:,}" in text
    assert plan.per_rank[0].memory.device <= 2**30


def test_rowwise_adagrad_is_taken_in_both_spellings(capsys):
    # `haloflow train dlrm` spells it rowwise_adagrad; plan-tables took only rowwise-adagrad.
    for typed in ("rowwise_adagrad", "rowwise-adagrad"):
        assert main(["plan-tables", "--tables", "kaggle", "--world-size", "4", "--memory-per-rank", "1GiB",
                     "--optimizer", typed]) == 0
        assert "optimizer rowwise_adagrad" in capsys.readouterr().out
