"""`--nproc`'s launcher as a user meets it, with real torchrun jobs run as `python -m haloflow` subprocesses:

* stopping the launcher stops the job: Ctrl-C (SIGINT to the terminal's process group), SIGTERM and SIGKILL of a
  `--nproc 2` GCN run leave no process of the job 10 s later; Ctrl-C prints one line saying the epoch and the
  last checkpoint, exits 130 and keeps the `--log-jsonl` file; SIGTERM prints one line and exits 143;
* two torchrun agents meeting at a c10d rendezvous on 127.0.0.1 (`--nnodes 2`) train the model one node's
  `--nproc 2` trains, bit for bit, and recover from a killed rank (`--max-restarts 1`) without a traceback;
* the multi-node flags' mistakes are one line each;
* the launcher parses, checks and starts the job without importing torch (its ranks do): every family's command
  line is validated torch-free, and the one-node run above is started by a launcher that reports its modules.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from haloflow.partition.api import PartitionConfig
from haloflow.partition.pipeline import partition_dataset
from tests.conftest import REPO
from tests.engine.scripts.common import small_dataset

GCN = ["train", "gcn", "--lr", "0.05", "--hidden", "8", "--no-progress", "--log-every", "1000"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
# `python -m haloflow ARGV` that says on its last stderr line whether the process imported torch
TELLS_TORCH = ("import sys; from haloflow.cli import main; status = main(sys.argv[1:]); "
               "print('torch imported:', 'torch' in sys.modules, file=sys.stderr); sys.exit(status)")


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> Path:
    """A 2-part folder whose path is in the command line of every process of a job (to find them in /proc)."""
    root = tmp_path_factory.mktemp("launcher-parts")
    data = small_dataset(num_nodes=150, num_edges=700, feat_dim=8, num_classes=3, seed=5)
    partition_dataset(data, PartitionConfig(num_parts=2, method="random", seed=1), root / "k2", progress=False)
    return root / "k2"


def start(*argv, out: Path, new_session: bool = False) -> subprocess.Popen:
    """``python -m haloflow ARGV`` with stdout and stderr to files under ``out`` (a pipe would stay open as long
    as any process of the job holds it, and a test waiting on it would wait for the whole run)."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "stdout", "w") as so, open(out / "stderr", "w") as se:
        return subprocess.Popen([sys.executable, "-m", "haloflow", *map(str, argv)], stdout=so, stderr=se,
                                cwd=REPO, env=ENV, start_new_session=new_session)


def job_processes(marker: str) -> list[str]:
    """``pid cmdline`` of every live process (not this one) whose command line names ``marker``; a zombie's
    command line is empty."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile
            continue
        if marker in cmdline:
            found.append(f"{entry.name} {cmdline}")
    return found


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl-c", "sigterm", "sigkill"])
def test_stopping_the_launcher_stops_the_whole_job(tmp_path, parts, how):
    ckpt, log = tmp_path / "ckpt", tmp_path / "log.jsonl"
    marker = str(tmp_path)  # in every command line of this job
    launcher = start(*GCN, "--partitions", parts, "--nproc", 2, "--epochs", 20000, "--checkpoint-dir", ckpt,
                     "--checkpoint-every", 20, "--log-jsonl", log, out=tmp_path, new_session=how == "ctrl-c")
    try:
        wait_for(lambda: any(ckpt.glob("step-*/manifest.json")) or launcher.poll() is not None, 120,
                 "the first checkpoint")
        assert launcher.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
        if how == "ctrl-c":  # what a terminal does: SIGINT to its foreground process group
            os.killpg(launcher.pid, signal.SIGINT)
        else:
            launcher.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
        status = launcher.wait(timeout=30)
        t0 = time.monotonic()
        wait_for(lambda: not job_processes(marker), 10, f"the job to end:\n{chr(10).join(job_processes(marker))}")
        assert time.monotonic() - t0 < 10
    finally:
        for line in job_processes(marker):  # a failure here leaves no training behind
            os.kill(int(line.split()[0]), signal.SIGKILL)
    err = (tmp_path / "stderr").read_text()
    if how == "sigkill":
        assert status == -signal.SIGKILL
        return
    assert "Traceback" not in err and err.count("\n") == 1, err
    if how == "sigterm":
        assert status == 128 + signal.SIGTERM and err == "haloflow train: stopped by SIGTERM\n", err
        return
    assert status == 130, err
    said = re.fullmatch(r"haloflow train: interrupted at epoch (\d+); last checkpoint: (\S+)\n", err)
    assert said, err
    epoch, last = int(said[1]), Path(said[2])
    assert last.parent == ckpt and (last / "manifest.json").is_file()
    assert 20 <= int(last.name.split("-")[1]) < epoch  # a checkpoint of this run, saved before the epoch it stopped
    records = [json.loads(line) for line in log.read_text().splitlines()]  # the log is kept, whole lines
    assert len(records) >= 20 and all(r["kind"] == "epoch" for r in records)


def free_port() -> int:
    """A port nobody listens on now (released before node 0 binds it: a small race with other programs)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(tmp_path: Path, name: str, *argv) -> tuple[str, str]:
    """``haloflow ARGV --nproc 1`` as nodes 0 and 1 of a two-node job on this machine; their stdout and stderr
    joined (rank 0, which prints the summary, may be on either node)."""
    endpoint = f"127.0.0.1:{free_port()}"
    nodes = [start(*argv, "--nproc", 1, "--nnodes", 2, "--node-rank", r, "--rdzv-endpoint", endpoint,
                   out=tmp_path / f"{name}{r}") for r in (0, 1)]
    try:
        status = [node.wait(timeout=240) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    out, err = ("".join((tmp_path / f"{name}{r}" / what).read_text() for r in (0, 1)) for what in ("stdout", "stderr"))
    assert status == [0, 0], err[-3000:]
    return out, err


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["state_dict"]


def assert_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.slow
def test_two_nodes_train_as_one_and_recover_from_a_killed_rank_without_a_traceback(tmp_path, parts):
    train = [*GCN, "--partitions", parts, "--epochs", 10]
    one = subprocess.run([sys.executable, "-c", TELLS_TORCH, *map(str, train), "--nproc", "2", "--save",
                          tmp_path / "one.pt"], capture_output=True, text=True, cwd=REPO, env=ENV, timeout=240)
    assert one.returncode == 0, one.stderr[-3000:]
    assert one.stderr.splitlines()[-1] == "torch imported: False", one.stderr[-3000:]  # the launcher: only its ranks
    # on two nodes, rank 1 killed at epoch 7: both nodes restart from epoch 6's checkpoint and end with the one-node
    # run's weights (a fault-free two-node run is not run as well: this one trains as one through the restart too)
    out, err = two_nodes(tmp_path, "fault", *train, "--save", tmp_path / "fault.pt", "--checkpoint-dir",
                         tmp_path / "ckpt", "--checkpoint-every", 3, "--max-restarts", 1, "--fail-at", 7,
                         "--fail-rank", 1)
    # no traceback: neither Python's, nor C++ stack frames of the rendezvous store, nor a stale attempt's gloo mesh
    assert "Traceback" not in err and "connectFullMesh" not in err and "frame #" not in err, err
    assert "rank 1: --fail-at 7: killing this rank (a testing aid)\n" in err
    assert re.search(r"resumed after epoch\s+6\b", out), out
    assert_equal(weights(tmp_path / "one.pt"), weights(tmp_path / "fault.pt"))


@pytest.mark.parametrize("argv, message", [
    (["--nproc", "1", "--nnodes", "2"], "--nnodes 2 needs --rdzv-endpoint HOST:PORT"),
    (["--nproc", "1", "--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"],
     "--node-rank 2 is not one of the 2 nodes (0 .. 1)"),
    (["--nproc", "2", "--rdzv-endpoint", "h:1"], "--rdzv-endpoint is where several nodes meet"),
    (["--nproc", "1", "--nnodes", "2", "--rdzv-endpoint", "h"], "--rdzv-endpoint must be HOST:PORT"),
    (["--nproc", "1", "--nnodes", "0"], "--nnodes must be >= 1, got 0"),
    (["--nnodes", "2", "--rdzv-endpoint", "h:1"], "give --nproc K (the ranks on each machine)"),
    (["--nproc", "2", "--nnodes", "2", "--rdzv-endpoint", "h:1"], "has 2 parts, which 4 processes cannot host"),
])
def test_multi_node_mistakes_are_one_line(cli_fails, parts, argv, message):
    cli_fails([*GCN, "--partitions", parts, *argv], message)


def test_the_ranks_command_line_drops_launch_flags_also_when_abbreviated():
    """argparse accepts `--npr 2` for `--nproc 2`; a rank that kept it would launch again."""
    from haloflow.cli import build_parser
    from haloflow.cli.runtime_args import _without_launch_flags

    argv = ["train", "gcn", "--dataset", "d", "--npr", "2", "--epochs", "3", "--nnod=2", "--node-r", "1",
            "--rdzv-endpoint", "h:1", "--max-restarts", "1"]
    args = build_parser("train").parse_args(argv)
    assert (args.nproc, args.nnodes, args.node_rank) == (2, 2, 1)  # what the launcher read
    rank_argv = _without_launch_flags(argv)
    assert rank_argv == ["train", "gcn", "--dataset", "d", "--epochs", "3", "--max-restarts", "1"]
    rank = build_parser("train").parse_args(rank_argv)
    assert (rank.nproc, rank.nnodes, rank.node_rank, rank.rdzv_endpoint) == (None, 1, 0, None)


def test_the_launcher_checks_every_family_s_command_line_without_torch(tmp_path, parts):
    """Each family's flags are parsed and its config validated (up to the check that comes last before torchrun
    starts) in a process that never imports torch: the launcher's ~3 s of CPU for torch's import would be paid
    before every job, beside the ranks' own."""
    events = tmp_path / "events.csv"
    events.write_text("u,i,ts,label\n0,1,1.0,0\n")
    argvs = ([*GCN, "--partitions", parts], ["train", "tgn", "--events", events, "--partitions", parts],
             ["train", "dlrm", "--synthetic"])
    for prelude, argv in [("", a) for a in argvs] + [("import torch; ", argvs[-1])]:  # the last: the control
        run = subprocess.run([sys.executable, "-c", prelude + TELLS_TORCH, *map(str, argv), "--nproc", "2",
                              "--max-restarts", "1"], capture_output=True, text=True, cwd=REPO, env=ENV, timeout=60)
        assert run.returncode == 2, run.stderr
        assert run.stderr.splitlines() == ["haloflow train: error: --max-restarts needs --checkpoint-dir: a restart "
                                           "continues from the last checkpoint",
                                           f"torch imported: {bool(prelude)}"], run.stderr
