"""The sweep over every output flag of every command, each pointed at what it must not replace: a link to someone
else's file, a FIFO (read by a thread), a character device (our own copies of /dev/null and /dev/full, made with
mknod, so that a bug cannot break the machine's), and a folder of someone else's holding their files -- including a
meta.json and a metadata.json, the names our own folders are recognised by.

The promise checked, for each (flag, target): exit 0 having written through the link, FIFO or device, or exit 2
with one line on stderr; and whatever happened, the target is still what it was (a link to the same file, a
FIFO, the same device, the folder with their files as they were) and no temporary is left beside it. Only a file
output through a link to a regular file may change that file: it is the output named on the command line.

::

    kind     the flag names             link->file      FIFO            /dev/null       /dev/full       their folder
    file     a file (--save, --out,     written         written         written         exit 2: no      exit 2: a
             --log-jsonl, --json)       through         through         through         space left      folder
    folder   a folder it replaces       exit 2          exit 2          exit 2          exit 2          exit 2: not
             (--out ... --overwrite)                                                                    ours
    into     a folder it writes into    exit 2          exit 2          exit 2          exit 2          written
             (--checkpoint-dir, demo)                                                                   into
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from haloflow.cli import main
from tests.conftest import reading_fifo
from tests.sweep.mutate import COUNTS, OUTCOMES

pytestmark = pytest.mark.timeout(400)

THEIRS = {"mine.txt": "someone's notes\n", "meta.json": '{"title": "my notes"}\n',
          "metadata.json": '{"format": "my-notes"}\n'}


@dataclass(frozen=True)
class Output:
    """One output flag: its command line with ``{out}`` where the path goes (``{sandbox}``: the folder the targets
    are made in, for another output the command needs), and its kind (module docstring)."""

    name: str
    kind: str
    argv: tuple[str, ...]


_GCN = ("train", "gcn", "--partitions", "{inputs}/k1", "--epochs", "2", "--hidden", "8", "--no-progress",
        "--device", "cpu")
_DLRM = ("train", "dlrm", "--synthetic", "--synthetic-max-rows", "20", "--synthetic-train", "64", "--synthetic-val",
         "16", "--batch-size", "16", "--max-steps", "3", "--no-progress", "--device", "cpu", "--bottom-mlp", "8",
         "--top-mlp", "8")
_TGN = ("train", "tgn", "--events", "{inputs}/events.csv", "--epochs", "1", "--max-batches", "2", "--no-progress",
        "--device", "cpu", "--memory-dim", "4", "--time-dim", "4", "--embedding-dim", "4")
OUTPUTS = [
    Output("partition --out", "folder", ("partition", "{inputs}/g.txt", "--parts", "2", "--method", "random",
                                         "--out", "{out}", "--overwrite")),
    Output("partition --memory-budget --out", "folder", ("partition", "{inputs}/g.txt", "--parts", "2", "--method",
                                                         "random", "--memory-budget", "4GiB", "--out", "{out}",
                                                         "--overwrite")),
    Output("partition --memory-budget --tmp-dir", "into", ("partition", "{inputs}/g.txt", "--parts", "2", "--method",
                                                           "random", "--memory-budget", "4GiB", "--tmp-dir",
                                                           "{out}", "--out", "{sandbox}/parts")),
    Output("preprocess criteo --out", "folder", ("preprocess", "criteo", "{inputs}/day_0.txt", "--out", "{out}",
                                                 "--overwrite")),
    Output("preprocess clicks --out", "folder", ("preprocess", "clicks", "--train", "20", "--val", "5", "--test",
                                                 "5", "--max-rows", "20", "--out", "{out}", "--overwrite")),
    Output("plan-tables --out", "file", ("plan-tables", "--tables", "{inputs}/tables.json", "--world-size", "2",
                                         "--memory-per-rank", "1GiB", "--out", "{out}")),
    Output("train gcn --save", "file", (*_GCN, "--save", "{out}")),
    Output("train gcn --log-jsonl", "file", (*_GCN, "--log-jsonl", "{out}")),
    Output("train dlrm --log-jsonl", "file", (*_DLRM, "--log-jsonl", "{out}")),
    Output("train tgn --log-jsonl", "file", (*_TGN, "--log-jsonl", "{out}")),
    Output("train gcn --checkpoint-dir", "into", (*_GCN, "--checkpoint-dir", "{out}")),
    Output("train dlrm --checkpoint-dir", "into", (*_DLRM, "--checkpoint-dir", "{out}")),
    Output("train tgn --checkpoint-dir", "into", (*_TGN, "--checkpoint-dir", "{out}")),
    Output("bench halo-build --out", "file", ("bench", "halo-build", "--scale", "8", "--parts", "2", "--out",
                                              "{out}")),
    Output("demo --out", "into", ("demo", "--nodes", "200", "--classes", "2", "--nproc", "1", "--epochs", "1",
                                  "--hidden", "4", "--out", "{out}")),
]
TARGETS = ["link to a file", "FIFO", "/dev/null", "/dev/full", "their folder"]
# What (kind, target) must give: "ok" (exit 0, written through or into), "refused" (exit 2, one line).
EXPECTED = {("file", t): "ok" for t in TARGETS[:3]} | {("file", "/dev/full"): "refused",
                                                       ("file", "their folder"): "refused"}
EXPECTED |= {("folder", t): "refused" for t in TARGETS}
EXPECTED |= {("into", t): "refused" for t in TARGETS[:4]} | {("into", "their folder"): "ok"}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Tiny inputs every command can start from."""
    from haloflow.partition.api import PartitionConfig
    from haloflow.partition.pipeline import partition_dataset
    from tests.engine.scripts.common import small_dataset

    root = tmp_path_factory.mktemp("output_inputs")
    rng = np.random.default_rng(0)
    partition_dataset(small_dataset(num_nodes=60, num_edges=200, feat_dim=4, num_classes=3, seed=2),
                      PartitionConfig(num_parts=1, method="random"), root / "k1", progress=False)
    (root / "g.txt").write_text("".join(f"{u}\t{v}\n" for u, v in rng.integers(0, 40, size=(120, 2))))
    (root / "day_0.txt").write_text(("1\t" + "\t".join(["3"] * 13) + "\t" + "\t".join(["68fd1e64"] * 26) + "\n") * 14)
    times = np.sort(rng.integers(0, 1000, 200))
    (root / "events.csv").write_text("u,i,ts,label\n" + "".join(
        f"{u},{v},{t},0\n" for (u, v), t in zip(rng.integers(0, 30, size=(200, 2)), times)))
    (root / "tables.json").write_text('{"tables": [{"name": "a", "num_rows": 1000, "dim": 8}]}')
    return root


def _snapshot(path: Path) -> tuple:
    """What a target is, to compare before and after: its type, a link's text, a device's number, a folder's
    files (theirs) with their contents."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return "link", os.readlink(path)
    if stat.S_ISDIR(st.st_mode):
        return "folder", {name: (path / name).read_text() for name in THEIRS}
    return stat.S_IFMT(st.st_mode), st.st_rdev


@contextlib.contextmanager
def _target(kind: str, where: Path, device_nodes: dict[str, Path]):
    """The path to give the flag, and the list a FIFO's reader fills (empty for other targets)."""
    if kind == "link to a file":
        (where / "theirs.txt").write_text("their file\n")
        (where / "out").symlink_to(where / "theirs.txt")
        yield where / "out", []
    elif kind == "FIFO":
        with reading_fifo(where / "out") as got:
            yield where / "out", got
    elif kind in ("/dev/null", "/dev/full"):
        yield device_nodes[kind.rsplit("/", 1)[1]], []
    else:
        (where / "out").mkdir()
        for name, text in THEIRS.items():
            (where / "out" / name).write_text(text)
        yield where / "out", []


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("output", OUTPUTS, ids=[o.name for o in OUTPUTS])
def test_an_output_never_replaces_what_it_did_not_create(inputs, tmp_path, device_nodes, output, target):
    what = f"output {output.name}"
    COUNTS[what] += 1
    where = tmp_path / "sandbox"
    where.mkdir()
    expected = EXPECTED[output.kind, target]
    with _target(target, where, device_nodes) as (path, got):
        before = _snapshot(path)
        argv = [a.format(inputs=inputs, out=path, sandbox=where) for a in output.argv]
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(argv)
    text = err.getvalue()
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith(("WARNING", "INFO"))]
    assert "Traceback" not in text, (argv, text)
    assert code == (0 if expected == "ok" else 2), (argv, code, text)
    if code == 2:
        assert len(lines) == 1 and ": error: " in lines[0], (argv, text)
    assert _snapshot(path) == before, (argv, text)  # still the same link, FIFO, device, or their folder as it was
    if target == "link to a file" and output.kind != "file":
        assert (where / "theirs.txt").read_text() == "their file\n", argv
    if target == "FIFO" and expected == "ok":
        assert got and got[0], (argv, "nothing came through the FIFO")
    hidden = [p.name for p in where.rglob(".*")]
    assert not hidden, (argv, hidden)  # no temporary left, here or inside their folder
    OUTCOMES[what, "ok" if code == 0 else "error"] += 1
