"""Process-group setup and failure handling: a dead or silent rank is an error on the others, not a hang."""

import json
import os
import re
import stat
from pathlib import Path

import pytest

import math

import torch

from haloflow.engine.runtime import (
    MetricsLog,
    ParallelLayout,
    Reporter,
    Runtime,
    RuntimeConfig,
    expect_parts,
    init_from_env,
    resolve_device,
)
from haloflow.errors import OutputExistsError
from haloflow.errors import ConfigError
from haloflow.partition.api import PartitionConfig
from haloflow.partition.pipeline import partition_dataset
from tests.conftest import reading_fifo, run_torchrun
from tests.engine.scripts.common import small_dataset

SCRIPTS = Path(__file__).parent / "scripts"
TIMEOUT_S = 5.0


def test_without_torchrun_is_single_process(monkeypatch):
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    ctx = init_from_env(device="cpu")
    assert (ctx.rank, ctx.world_size, ctx.distributed, ctx.is_main) == (0, 1, False, True)


def test_bad_environment_is_named(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ConfigError, match="WORLD_SIZE='two' is not an integer"):
        init_from_env(device="cpu")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ConfigError, match=r"device must be one of \('auto', 'cpu', 'cuda'\), got 'tpu'"):
        init_from_env(device="tpu")


def test_layout_is_validated_once_with_the_arithmetic_in_the_message():
    cpu = torch.device("cpu")
    with pytest.raises(ConfigError, match=r"rank 2 is not in \[0, 2\)"):
        ParallelLayout(rank=2, world_size=2, local_rank=0, device=cpu, backend="gloo", group=object())
    with pytest.raises(ConfigError, match="NCCL needs a CUDA device"):
        ParallelLayout(rank=0, world_size=1, local_rank=0, device=cpu, backend="nccl")
    with pytest.raises(ConfigError, match="2 ranks need a process group"):
        ParallelLayout(rank=0, world_size=2, local_rank=0, device=cpu, backend="gloo")
    with pytest.raises(ConfigError, match="parts has 4 parts but 2 processes run: start 4") as err:
        expect_parts(4, 2, "parts")
    assert err.value.field == "nproc"


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present here")
def test_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(ConfigError, match="device 'cuda' was asked for, but torch sees no CUDA device"):
        resolve_device("cuda")
    assert resolve_device("auto") == torch.device("cpu")


def test_metrics_are_json_lines_streamed_from_the_first_record_and_nan_is_null(tmp_path):
    path = tmp_path / "sub" / "m.jsonl"
    log = MetricsLog(path)
    log.write({"loss": 0.5, "auc": math.nan, "xs": (1, math.inf)})
    # there at once (tail -f follows it), under its own name: no temporary beside it
    assert [json.loads(x) for x in path.read_text().splitlines()] == [{"loss": 0.5, "auc": None, "xs": [1, None]}]
    assert sorted(p.name for p in path.parent.iterdir()) == ["m.jsonl"]
    log.write({"loss": 0.25})
    log.close()
    assert len(path.read_text().splitlines()) == 2


def test_a_new_run_truncates_an_old_log_and_a_failed_run_keeps_its_lines(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"kind": "epoch", "epoch": 7}\n' * 3)  # an old run's log (ours: replaced)
    with pytest.raises(RuntimeError, match="boom"):
        with Runtime.start(RuntimeConfig(device="cpu", progress=False, log_jsonl=path), join=False) as rt:
            rt.metrics.write({"epoch": 0})
            raise RuntimeError("boom")
    assert [json.loads(x) for x in path.read_text().splitlines()] == [{"epoch": 0}]


def test_a_log_path_holding_someone_elses_file_is_refused_unless_overwrite(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"an": "old run of something else"}\n')
    with pytest.raises(OutputExistsError, match="--log-jsonl .*did not write"):
        RuntimeConfig(device="cpu", log_jsonl=path)
    assert path.read_text() == '{"an": "old run of something else"}\n'
    RuntimeConfig(device="cpu", log_jsonl=path, overwrite=True)  # with --overwrite: accepted


def test_a_fifo_log_is_written_through(tmp_path):
    fifo = tmp_path / "m.fifo"
    with reading_fifo(fifo) as got:
        log = MetricsLog(fifo)
        log.write({"epoch": 0})
        log.close()
    assert got == [b'{"epoch": 0}\n'] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_reporter_prints_a_line_every_n_steps_without_a_terminal(capsys):
    import sys

    rep = Reporter(total=5, unit="epoch", desc="train", every=2, enabled=True, progress=True, stream=sys.stdout)
    for i in range(5):
        rep.update({"loss": 1.0 / (i + 1), "n": i})
    rep.close()
    lines = capsys.readouterr().out.splitlines()  # stderr is not a terminal under pytest: no bar
    assert lines == ["train: epoch 2/5  loss 0.5  n 1", "train: epoch 4/5  loss 0.25  n 3",
                     "train: epoch 5/5  loss 0.2  n 4"]


def test_a_run_alone_reports_its_threads_and_start_up(monkeypatch):
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    with Runtime.start(RuntimeConfig(device="cpu")) as rt:
        assert rt.started() >= 0 and rt.threads == torch.get_num_threads()
        assert rt.describe().startswith(f"1 rank x {rt.threads} thread")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["killed", "stalled"])
def test_lost_rank_fails_the_others_within_the_timeout(tmp_path, mode):
    parts = tmp_path / "parts"
    partition_dataset(small_dataset(), PartitionConfig(num_parts=2, method="random"), parts, progress=False)
    proc = run_torchrun(SCRIPTS / "fault.py", 2, [parts, tmp_path, mode, TIMEOUT_S], timeout=120)
    record = json.loads((tmp_path / "rank0.json").read_text())  # rank 1 never writes: it is the lost one
    assert not (tmp_path / "rank1.json").exists()
    assert record["type"] == "DistributedError", (record, proc.stderr[-2000:])
    assert "rank 0:" in record["error"]
    if mode == "killed":  # the survivor names the rank that has gone
        assert re.search(r"rank 1 \(pid \d+\) has exited", record["error"]), record
    else:
        # the survivors' roll call in the rendezvous store: the rank that does not answer is the silent one
        assert re.search(r"rank 1 \(pid \d+\) stopped answering", record["error"]), record
    # from the fault to the error: the timeout plus slack for a loaded machine, no hang (the run as a whole,
    # start-up and numba kernels included, only has to end well within the 120 s launch limit)
    assert record["after_fault_s"] < TIMEOUT_S + 10, record
    assert record["elapsed_s"] < 90, record
    if mode == "stalled":
        assert "Timed out waiting 5000ms" in record["error"]  # gloo's own words name the timeout


@pytest.mark.slow
def test_a_timed_out_launch_takes_its_ranks_down(tmp_path):
    """Killing torchrun alone would orphan its ranks, which would hold the cores through the following tests."""
    import os
    import subprocess
    import time

    with pytest.raises(subprocess.TimeoutExpired):
        run_torchrun(SCRIPTS / "sleeper.py", 2, [tmp_path], timeout=10)  # ranks import no torch: pids in ~3 s
    pids = [int((tmp_path / f"rank{r}.pid").read_text()) for r in range(2)]
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        time.sleep(0.1)
    assert not alive, f"ranks {alive} still running after the launch timed out"


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (dead, not yet reaped by its orphaned parent) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False
