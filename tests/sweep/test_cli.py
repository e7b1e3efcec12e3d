"""The sweep over the CLI commands, with flags drawn from good and bad values (negative, zero, huge, NaN, inf,
1e400, words; files missing, folders for files, outputs under a file or in /sys, which even root cannot write).
Most examples call ``haloflow.cli.main`` in this process; a few run ``python -m haloflow`` as a user would.

The promise checked: exit 0, or exit 2 with one line on stderr and no traceback (argparse's own usage errors
also exit 2, with its usage line first); and an output (``--out``, ``--save``, ``--log-jsonl``) either complete
or absent, with no temporary left beside it.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from haloflow.cli import main
from tests.sweep.mutate import COUNTS, OUTCOMES, SLOW_S, SWEEP

pytestmark = pytest.mark.timeout(400)

INTS = ["-1", "0", "1", "2", "3", "1000000", "9223372036854775808", "x"]
FLOATS = ["nan", "inf", "-inf", "1e400", "-1", "0", "0.5", "1", "2", "1e-300"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Small valid inputs every command can start from."""
    from haloflow.data.clicks import ClickLogConfig, ClickLogGenerator
    from haloflow.partition.api import PartitionConfig
    from haloflow.partition.pipeline import partition_dataset
    from tests.engine.scripts.common import small_dataset

    root = tmp_path_factory.mktemp("cli_inputs")
    rng = np.random.default_rng(0)
    edges = rng.integers(0, 40, size=(120, 2))
    (root / "g.txt").write_text("# a graph\n" + "".join(f"{u}\t{v}\n" for u, v in edges))
    (root / "g1.txt").write_text("src dst w\n" + "".join(f"{u + 1} {v + 1} 0.5\n" for u, v in edges))
    dataset = small_dataset(num_nodes=60, num_edges=200, feat_dim=4, num_classes=3, seed=2)
    for k in (1, 2):
        partition_dataset(dataset, PartitionConfig(num_parts=k, method="random"), root / f"parts{k}", progress=False)
    ClickLogGenerator(ClickLogConfig(scale=1e-4, max_rows=20)).write_parquet(
        root / "clicks", {"train": 64, "val": 32, "test": 16}, row_group_size=16)
    times = np.sort(rng.integers(0, 1000, 200))
    (root / "events.csv").write_text("u,i,ts,label\n" + "".join(
        f"{u},{v},{t},0\n" for (u, v), t in zip(rng.integers(0, 30, size=(200, 2)), times)))
    (root / "tables.json").write_text('{"tables": [{"name": "a", "num_rows": 1000, "dim": 8}, '
                                      '{"name": "b", "num_rows": 50, "dim": 8}]}')
    (root / "note.txt").write_text("a file, not a folder")
    (root / "empty").mkdir()
    return root


def _path(data, inputs: Path, tmp: Path, good: str) -> str:
    """A path argument: mostly the good input, sometimes missing, a folder, a file, or unreadable."""
    return data.draw(st.sampled_from([
        str(inputs / good), str(inputs / good), str(inputs / good), str(tmp / "missing"), str(inputs / "empty"),
        str(inputs / "note.txt"), "/sys/haloflow-nowhere"]))


def _out(data, inputs: Path, tmp: Path) -> str:
    """An output path: mostly fresh, sometimes existing, under a file, or where nothing may be written."""
    return data.draw(st.sampled_from([
        str(tmp / "out"), str(tmp / "out"), str(tmp / "sub" / "out"), str(inputs / "note.txt" / "out"),
        str(inputs / "note.txt"), str(inputs / "empty"), "/sys/haloflow-out"]))


def _flags(data, table: dict[str, list[str]], at_most: int = 3) -> list[str]:
    """A few flags of ``table``, each with a drawn value ('' = a flag without a value)."""
    names = data.draw(st.lists(st.sampled_from(sorted(table)), max_size=at_most, unique=True))
    argv = []
    for name in names:
        value = data.draw(st.sampled_from(table[name]))
        argv += [name] if value == "" else [f"{name}={value}"]
    return argv


def _run_cli(what: str, argv: list[str], outputs: list[Path]) -> int:
    """``haloflow ARGV`` in this process, held to the promise in the module docstring."""
    COUNTS[what] += 1
    existed = {p: p.exists() for p in outputs}
    err, out = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse: a value of the wrong type or choice
            code = e.code
            assert code == 2 and "error: " in err.getvalue().strip().splitlines()[-1], (argv, err.getvalue())
            OUTCOMES[what, "error"] += 1
            return code
    elapsed = time.perf_counter() - t0
    text = err.getvalue()
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith(("WARNING", "INFO"))]
    assert "Traceback" not in text, (argv, text)
    assert code in (0, 2), (argv, code, text)
    if code == 2:
        assert len(lines) == 1 and ": error: " in lines[0], (argv, text)
        for p, was in existed.items():  # nothing half-written, no temporary left
            assert p.exists() == was, (argv, p, text)
            if p.parent.is_dir():
                assert not [q for q in p.parent.iterdir() if q.name.startswith(f".{p.name}.")], (argv, text)
    OUTCOMES[what, "ok" if code == 0 else "error"] += 1
    assert elapsed < SLOW_S, (argv, f"{elapsed:.1f} s")
    return code


@settings(max_examples=50, **SWEEP)
@given(st.data())
def test_partition(inputs, data):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        out = _out(data, inputs, tmp)
        argv = ["partition", _path(data, inputs, tmp, data.draw(st.sampled_from(["g.txt", "g1.txt"]))),
                "--parts", data.draw(st.sampled_from(["2", "3", "2", "3"] + INTS)), "--out", out]
        argv += _flags(data, {"--method": ["metis", "fennel", "random", "bogus"], "--imbalance": FLOATS,
                              "--balance": ["nodes", "nodes,edges", "train", "colour", ",", ""], "--seed": INTS,
                              "--num-nodes": INTS, "--one-based": [""], "--overwrite": [""],
                              "--no-symmetrize": [""], "--format": ["snap", "pace", "ogb", "auto"]})
        _run_cli("haloflow partition", argv, [Path(out)])


@settings(max_examples=60, **SWEEP)
@given(st.data())
def test_plan_tables(inputs, data):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        argv = ["plan-tables", "--tables", data.draw(st.sampled_from(
                    ["kaggle", str(inputs / "tables.json"), str(inputs / "clicks"), str(inputs / "empty"),
                     str(tmp / "missing.json")])),
                "--world-size", data.draw(st.sampled_from(["2", "3", "2", "3", "-1", "0", "1", "20000", "x"])),
                "--memory-per-rank=" + data.draw(st.sampled_from(
                    ["1GiB", "1GiB", "64MiB", "0", "1e400", "nan", "-1", "1GiB,2GiB", "abc", "1e-300", "1e12TiB"]))]
        outputs = []
        if data.draw(st.booleans()):
            outputs.append(Path(_out(data, inputs, tmp)))
            argv += ["--out", str(outputs[0])]
        argv += _flags(data, {"--batch-size": INTS, "--dim": INTS, "--reserve": FLOATS,
                              "--lookup-bandwidth": ["0", "nan", "1e400", "1TB", "-1"],
                              "--a2a-bandwidth": ["0", "25GB", "inf"], "--optimizer": ["sgd", "adam", "x"],
                              "--dp-grad": ["sparse", "dense", "x"]})
        _run_cli("haloflow plan-tables", argv, outputs)


@settings(max_examples=40, **SWEEP)
@given(st.data())
def test_preprocess_clicks(inputs, data):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        out = _out(data, inputs, tmp)
        argv = ["preprocess", "clicks", "--out", out, "--max-rows", data.draw(st.sampled_from(["20", "20", "20", "1", "0", "-1"])),
                "--train", data.draw(st.sampled_from(["20", "20", "3", "0", "-1"])),  # small: the sweep is about mistakes
                "--val", data.draw(st.sampled_from(["5", "5", "0", "-1"])), "--test", "5"]
        argv += _flags(data, {"--scale": FLOATS + ["1e-4", "1e12"], "--multi-hot": FLOATS + ["1e9"],
                              "--row-group-size": ["-1", "0", "4"], "--seed": INTS, "--overwrite": [""]})
        _run_cli("haloflow preprocess clicks", argv, [Path(out)])


@settings(max_examples=30, **SWEEP)
@given(st.data())
def test_preprocess_criteo_paths(inputs, data):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        raw = tmp / "day_0.txt"
        raw.write_text("".join("1\t" + "\t".join(["3"] * 13) + "\t" + "\t".join(["68fd1e64"] * 26) + "\n"
                               for _ in range(14)))
        out = _out(data, inputs, tmp)
        first = data.draw(st.sampled_from([str(raw), str(raw), str(inputs / "empty"), str(tmp / "missing.txt"),
                                           str(inputs / "note.txt"), str(inputs / "g.txt")]))
        argv = ["preprocess", "criteo", first, *([str(raw)] if data.draw(st.booleans()) else []), "--out", out]
        argv += _flags(data, {"--max-ind-range": INTS, "--frequency-threshold": INTS, "--strict": [""],
                              "--layout": ["auto", "kaggle", "days", "x"], "--row-group-size": INTS[:4]})
        _run_cli("haloflow preprocess criteo", argv, [Path(out)])


@settings(max_examples=50, **SWEEP)
@given(st.data())
def test_train_gcn(inputs, data):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        argv = ["train", "gcn", "--partitions", _path(data, inputs, tmp, "parts1"), "--epochs",
                data.draw(st.sampled_from(["1", "2", "1", "2", "-1", "0"])), "--no-progress", "--device", "cpu"]
        outputs = []
        for flag in ("--save", "--log-jsonl"):
            if data.draw(st.integers(0, 3)) == 0:
                outputs.append(Path(_out(data, inputs, tmp)))
                argv += [flag, str(outputs[-1])]
        argv += _flags(data, {"--hidden": ["-1", "0", "1", "8", "1000000000"], "--layers": ["-1", "0", "1", "3",
                              "1000000"], "--dropout": FLOATS, "--lr": FLOATS, "--weight-decay": FLOATS,
                              "--optimizer": ["adam", "sgd", "x"], "--conv": ["gcn", "sage", "gat"],
                              "--kernel": ["numba", "torch", "x"], "--staleness": ["-1", "0", "1", "2"],
                              "--halo-keep": FLOATS, "--bucket-bytes": INTS, "--timeout": FLOATS,
                              "--log-every": INTS[:4], "--seed": INTS, "--no-precompute": [""],
                              "--no-normalize": [""]})
        _run_cli("haloflow train gcn", argv, [p for p in outputs if not p.exists()])


@settings(max_examples=40, **SWEEP)
@given(st.data())
def test_train_dlrm(inputs, data):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        source = (["--synthetic", "--synthetic-max-rows", data.draw(st.sampled_from(["20", "20", "-1", "0", "1"])),
                   "--synthetic-train", data.draw(st.sampled_from(["64", "64", "-1", "0", "1"])),
                   "--synthetic-val", data.draw(st.sampled_from(["16", "16", "-1", "0"]))]
                  if data.draw(st.booleans()) else ["--data", _path(data, inputs, tmp, "clicks")])
        argv = ["train", "dlrm", *source, "--batch-size", data.draw(st.sampled_from(["16", "16", "-1", "0", "1"])),
                "--max-steps", data.draw(st.sampled_from(["3", "3", "-1", "0", "1"])), "--no-progress", "--device", "cpu",
                "--bottom-mlp", "8", "--top-mlp", "8"]
        outputs = []
        if data.draw(st.integers(0, 3)) == 0:
            outputs.append(Path(_out(data, inputs, tmp)))
            argv += ["--log-jsonl", str(outputs[-1])]
        argv += _flags(data, {"--max-eval-batches": ["-1", "0", "1"], "--embedding-dim": ["-1", "0", "1", "4",
                              "1000000000"], "--bottom-mlp": ["0", "-1", "8,4", "x"], "--lr": FLOATS,
                              "--cache-ratio": FLOATS, "--optimizer": ["sgd", "adagrad", "rowwise_adagrad", "x"],
                              "--epochs": ["0", "1"], "--synthetic-scale": FLOATS, "--log-every": INTS[:4],
                              "--timeout": FLOATS, "--plan": [str(inputs / "tables.json"), str(tmp / "nope.json")]})
        _run_cli("haloflow train dlrm", argv, [p for p in outputs if not p.exists()])


@settings(max_examples=25, **SWEEP)
@given(st.data())
def test_train_tgn(inputs, data):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        argv = ["train", "tgn", "--events", _path(data, inputs, tmp, "events.csv"), "--epochs",
                data.draw(st.sampled_from(["1", "1", "0"])), "--max-batches", data.draw(st.sampled_from(["2", "2", "-1", "0"])),
                "--no-progress", "--device", "cpu", "--memory-dim", "4", "--time-dim", "4", "--embedding-dim", "4"]
        argv += _flags(data, {"--batch-size": ["-1", "0", "1", "50"], "--neighbors": ["-1", "0", "1", "3"],
                              "--mrr-negatives": ["-1", "0", "2"], "--lr": FLOATS, "--no-eval": [""],
                              "--partitions": [str(inputs / "parts2"), str(inputs / "empty")],
                              "--memory-dim": ["0", "-1", "8"], "--timeout": FLOATS}, at_most=3)
        _run_cli("haloflow train tgn", argv, [])


@settings(max_examples=20, **SWEEP)
@given(st.data())
def test_inspect(inputs, data):
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["inspect", _path(data, inputs, Path(tmp), data.draw(st.sampled_from(["parts1", "parts2"])))]
        argv += _flags(data, {"--no-verify": [""]})
        _run_cli("haloflow inspect", argv, [])


# A few runs as a user makes them: a new Python process, `python -m haloflow`, stderr as printed.
_SUBPROCESS = [
    ["partition", "{inputs}/g.txt", "--parts", "0", "--out", "{tmp}/o"],
    ["train", "gcn", "--partitions", "{inputs}/parts1", "--hidden", "1000000000", "--no-progress"],
    ["plan-tables", "--tables", "kaggle", "--world-size", "2", "--memory-per-rank", "1e400"],
]


@pytest.mark.parametrize("argv", _SUBPROCESS, ids=[a[0] for a in _SUBPROCESS])
def test_as_a_process(inputs, tmp_path, argv):
    COUNTS["python -m haloflow (a process)"] += 1
    argv = [a.format(inputs=inputs, tmp=tmp_path) for a in argv]
    proc = subprocess.run([sys.executable, "-m", "haloflow", *argv], capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "o").exists()
    OUTCOMES["python -m haloflow (a process)", "error"] += 1
