"""`haloflow bench`: the list, a real (small) run through the CLI, and a clear error for an unknown name."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from haloflow.bench import BENCHMARKS
from haloflow.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_without_a_name_it_lists_every_benchmark(capsys):
    assert main(["bench"]) == 0
    out = capsys.readouterr().out
    for name, bench in BENCHMARKS.items():
        assert name in out and bench.summary[:40] in out


def test_unknown_benchmark_is_a_one_line_error(cli_fails):
    cli_fails(["bench", "speed"], "haloflow bench: error: unknown benchmark 'speed'", "partition, partition-ooc, gcn, gcn-dist")


def test_a_small_run_writes_its_json(tmp_path, capsys):
    out = tmp_path / "halo.json"
    assert main(["bench", "halo-build", "--scale", "10", "--parts", "4", "--out", str(out)]) == 0
    assert "halo" in capsys.readouterr().out.lower()
    assert json.loads(out.read_text())


def test_options_go_to_the_benchmark(capsys):
    try:
        main(["bench", "planner", "--help"])
    except SystemExit as exit_:
        assert exit_.code == 0
    out = capsys.readouterr().out
    assert "usage: haloflow bench planner" in out and "--timing-tables" in out


def test_every_benchmark_module_imports_and_its_script_wrapper_points_at_it():
    import importlib

    for name, bench in BENCHMARKS.items():
        module = importlib.import_module(bench.module)
        assert callable(module.main), name
        script = ROOT / "benchmarks" / f"{bench.module.rsplit('.', 1)[1]}.py"
        assert f"from {bench.module} import main" in script.read_text(), script


def test_script_wrapper_runs_the_same_code(tmp_path):
    out = tmp_path / "halo.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "halo_build.py"), "--scale", "10", "--parts", "2",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(out.read_text())


@pytest.mark.slow
def test_dlrm_memory_ranks_hold_exactly_the_plans_bytes(tmp_path, capsys):
    # Two real gloo ranks on a cached plan of small Kaggle-shaped tables (and the overhead run): each rank's
    # embedding storage (device and host) equals the plan's bytes for it, and the table and JSON come out.
    out = tmp_path / "mem.json"
    main(["bench", "dlrm-memory", "--ks", "2", "--kinds", "cached", "--max-rows", "5000", "--overhead-rows", "200",
          "--steps", "3", "--batch-size", "256", "--out", str(out)])
    report = json.loads(out.read_text())
    (run,) = report["runs"]
    assert run["world_size"] == 2 and run["run"]["plan_kinds"].get("cached", 0) > 0
    for r in run["run"]["ranks"]:
        assert (r["storage_device"], r["storage_host"]) == (r["plan_device"], r["plan_host"])
        assert r["peak_rss"] > r["plan_device"] + r["plan_host"]
    assert "peak RSS" in capsys.readouterr().out


@pytest.mark.parametrize("name, argv", [
    ("gcn", ["--nodes", "400", "--entries", "2000", "--in-dim", "8", "--hidden", "8", "--out-dim", "4", "--epochs",
             "1", "--warmup", "0", "--spmm-repeats", "1", "--widths", "8"]),
    ("dlrm", ["--ranks", "--steps", "2", "--warmup", "1", "--rounds", "1", "--max-rows", "100"]),
    ("readers", ["--graphs", "enron", "--repeat", "1"]),
])
def test_every_benchmark_says_where_its_json_went(tmp_path, capsys, request, name, argv):
    if name == "readers":
        request.getfixturevalue("shared_data")  # the real graphs it reads
    out = tmp_path / f"{name}.json"
    main(["bench", name, *argv, "--out", str(out)])
    assert json.loads(out.read_text())
    assert f"wrote {out}" in capsys.readouterr().out


def test_bench_cache_measures_each_readers_rss_in_a_fresh_process(tmp_path, capsys):
    # The RSS column used to be a difference of peaks in one process ("peak RSS -72.0 KiB"): the later readers
    # reused the earlier ones' memory. Each reader now runs in a process of its own; a np.memmap reader that
    # touches the whole table grows by about the table.
    out = tmp_path / "cache.json"
    assert main(["bench", "cache", "--scale", "100000", "--batches", "5", "--trace-batch-size", "16",
                 "--rows", "20000", "--steps", "10", "--batch-size", "4096", "--dlrm-max-rows", "50",
                 "--dlrm-steps", "4", "--mmap-rounds", "1", "--no-progress", "--out", str(out)]) == 0
    m = json.loads(out.read_text())["mmap_training"]
    assert m["identical_tables"]
    growth = {k: m[f"{k}_rss_growth_bytes"] for k in ("memmap", "cached", "cached_no_prefetch")}
    assert all(g >= 0 for g in growth.values()), growth
    if m["peak_reset"]:  # VmHWM could be reset (Linux): the peer's growth is its mapped pages, about the table
        assert 0.5 * m["table_bytes"] < growth["memmap"] < m["table_bytes"] + (16 << 20), growth
    text = capsys.readouterr().out
    assert "RSS growth" in text and "each reader in a fresh process" in text and f"wrote {out}" in text
    report = json.loads(out.read_text())
    d = report["dlrm"]  # the trainer's step through a lookahead cache: the uncached floats
    assert d["policy"] == "lookahead" and all(d[k]["identical_to_uncached"] for k in ("1% cached", "5% cached"))
    assert 0 < report["zipf"]["lookahead-admit (device)"]["0.01"] <= report["zipf"]["belady"]["0.01"]
