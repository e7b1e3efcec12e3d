"""The second bad-input sweep's cases as data: one ``Case`` per command a new user or an adversarial tester typed,
with what it must print, the exit status it must end with, and the files it must leave byte for byte as they were.

::

    Case(id, argv, code, says, keep=(), absent=(), gone=(), setup=None)

    argv    the command line after ``haloflow``; ``{in}`` is the shared inputs folder (``build_inputs``), ``{tmp}``
            the case's own empty folder
    code    0 (a valid input: it works), 1 (a run that failed: a NaN loss) or 2 (a user's mistake: one line)
    says    a piece of what stdout + stderr must hold: the line naming the file, flag or run
    keep    paths (files or folders) whose bytes must be the same after the command as before
    absent  paths that must not exist afterwards (nothing half-made: ``demo``'s parts-1/)
    gone    paths that must have been removed (a killed run's temporaries)
    setup   ``setup(tmp)`` makes what the case starts from (someone's file where an output goes, a killed run's
            leftovers)

``run_case`` calls ``haloflow.cli.main`` in this process: no traceback, the status and the message as given, the
kept files unchanged. Every case here failed on the code before issue 37 (a traceback, exit 0 on bad input, a
file replaced or deleted, or a run that did not end).
"""

from __future__ import annotations

import contextlib
import io
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from haloflow.cli import main
from tests.sweep.mutate import COUNTS, OUTCOMES

__all__ = ["Case", "run_case", "build_inputs", "snapshot", "dead_pid", "GCN", "DLRM", "TGN"]

GCN = ("train", "gcn", "--partitions", "{in}/k1", "--epochs", "2", "--hidden", "4", "--no-progress", "--device", "cpu")
DLRM = ("train", "dlrm", "--synthetic", "--synthetic-max-rows", "20", "--synthetic-train", "64", "--synthetic-val",
        "16", "--batch-size", "16", "--max-steps", "3", "--no-progress", "--device", "cpu", "--bottom-mlp", "8",
        "--top-mlp", "8", "--embedding-dim", "4")
TGN = ("train", "tgn", "--events", "{in}/events.csv", "--epochs", "1", "--max-batches", "2", "--no-progress",
       "--device", "cpu", "--memory-dim", "4", "--time-dim", "4", "--embedding-dim", "4")


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    code: int
    says: str
    keep: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    gone: tuple[str, ...] = ()
    setup: Callable[[Path], None] | None = field(default=None, compare=False)


def build_inputs(root: Path) -> Path:
    """Small valid inputs every case starts from (built once per session), and a few broken ones."""
    from haloflow.data.graph_folder import write_graph_folder
    from haloflow.partition.api import PartitionConfig
    from haloflow.partition.pipeline import partition_dataset
    from tests.data.test_planetoid import make_planetoid
    from tests.engine.scripts.common import small_dataset

    rng = np.random.default_rng(0)
    dataset = small_dataset(num_nodes=60, num_edges=200, feat_dim=4, num_classes=3, seed=2)
    partition_dataset(dataset, PartitionConfig(num_parts=1, method="random"), root / "k1", progress=False)
    edges = "".join(f"{u}\t{v}\n" for u, v in rng.integers(0, 40, size=(120, 2)))
    (root / "g.txt").write_text(edges)
    (root / "data.csv").write_text("id,value\n1,0.5\n2,0.25\n")  # someone's data file, where an output goes
    (root / "nul.txt").write_bytes(b"0\t1\n1\t2\n2\x003\n3\t4\n")
    times = np.sort(rng.integers(0, 1000, 200))
    (root / "events.csv").write_text("u,i,ts,label\n" + "".join(
        f"{u},{v},{t},0\n" for (u, v), t in zip(rng.integers(0, 30, size=(200, 2)), times)))
    for n in (0, 1, 5):  # streams too short to split into train / val / test, or to fill one batch
        (root / f"events{n}.csv").write_text("u,i,ts,label\n" + "".join(f"{i},{i + 1},{i},0\n" for i in range(n)))
    (root / "tables.json").write_text('{"tables": [{"name": "a", "num_rows": 1000, "dim": 8}]}')
    (root / "huge-rows.json").write_text('{"tables": [{"name": "a", "num_rows": 100000000000000000000, "dim": 8}]}')
    (root / "huge-dim.json").write_text('{"tables": [{"name": "a", "num_rows": 10, "dim": 100000000000000000000}]}')
    make_planetoid(root / "planetoid", np.random.default_rng(0), name="cora")
    bad = root / "planetoid-bad"
    make_planetoid(bad, np.random.default_rng(0), name="cora")
    lines = (bad / "ind.cora.test.index").read_text().splitlines()
    lines[1] = "999999"  # one id far past the rows: it sized every array by it
    (bad / "ind.cora.test.index").write_text("\n".join(lines) + "\n")
    overlap = dataset.train_mask.copy()
    write_graph_folder(root / "overlap", dataset)  # then a val split that shares train nodes
    np.save(root / "overlap" / "val_mask.npy", dataset.val_mask | overlap)
    write_graph_folder(root / "noval", dataset)  # then no validation nodes at all
    np.save(root / "noval" / "val_mask.npy", np.zeros_like(dataset.val_mask))
    return root


def dead_pid() -> int:
    """The id of a process that has ended (and been waited for): what a killed run's temporaries carry."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def snapshot(path: Path):
    """A path's bytes (a file), or every file's under it (a folder), or None when absent."""
    if path.is_symlink():
        return ("link", str(path.readlink()))
    if path.is_file():
        return path.read_bytes()
    if path.is_dir():
        return {str(p.relative_to(path)): p.read_bytes() if p.is_file() else None for p in sorted(path.rglob("*"))}
    return None


def _fill(text: str, inputs: Path, tmp: Path) -> str:
    return text.replace("{in}", str(inputs)).replace("{tmp}", str(tmp))


def run_case(case: Case, inputs: Path, tmp: Path, group: str, logged: Callable[[], str] = str) -> str:
    """Run ``case`` (module docstring) and hold it to its promise; returns what it printed. ``logged``: the log
    records' text (pytest's ``caplog.text``), where warnings go once logging was set up by an earlier call."""
    COUNTS[f"issue 37 {group}"] += 1
    if case.setup is not None:
        case.setup(tmp)
    keep = {p: snapshot(Path(_fill(p, inputs, tmp))) for p in case.keep}
    argv = [_fill(a, inputs, tmp) for a in case.argv]
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse: a value of the wrong type, refused before any work
            code = e.code
    text = out.getvalue() + err.getvalue() + logged()
    assert "Traceback" not in text, (argv, text)
    assert code == case.code, (argv, code, text)
    assert case.says in text, (argv, case.says, text)
    if code != 0:
        lines = [x for x in err.getvalue().splitlines() if x.strip() and not x.startswith(("WARNING", "INFO"))]
        assert lines and "error: " in lines[-1], (argv, text)
        if not lines[0].startswith("usage:"):  # argparse's own errors: its usage line, then one line
            assert len(lines) == 1, (argv, text)
    for p, before in keep.items():
        assert snapshot(Path(_fill(p, inputs, tmp))) == before, (argv, p, "changed")
    for p in case.absent + case.gone:
        assert not Path(_fill(p, inputs, tmp)).exists(), (argv, p, "exists")
    OUTCOMES[f"issue 37 {group}", "ok" if code == 0 else "error"] += 1
    return text
