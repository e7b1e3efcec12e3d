"""Process-group setup and failure handling: a dead or silent rank is an error on the others, not a hang."""

import json
from pathlib import Path

import pytest

from haloflow.engine.dist import init_from_env
from haloflow.errors import ConfigError
from haloflow.partition.api import PartitionConfig
from haloflow.partition.pipeline import partition_dataset
from tests.conftest import run_torchrun
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
    with pytest.raises(ConfigError, match="device must be 'auto', 'cpu' or 'cuda', got 'tpu'"):
        init_from_env(device="tpu")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["killed", "stalled"])
def test_lost_rank_fails_the_others_within_the_timeout(tmp_path, mode):
    parts = tmp_path / "parts"
    partition_dataset(small_dataset(), PartitionConfig(num_parts=2, method="random"), parts, progress=False)
    proc = run_torchrun(SCRIPTS / "fault.py", 2, [parts, tmp_path, mode, TIMEOUT_S], timeout=120)
    record = json.loads((tmp_path / "rank0.json").read_text())  # rank 1 never writes: it is the lost one
    assert not (tmp_path / "rank1.json").exists()
    assert record["type"] == "DistributedError", (record, proc.stderr[-2000:])
    assert "rank 0:" in record["error"] and "peer process died or did not answer" in record["error"]
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
        run_torchrun(SCRIPTS / "sleeper.py", 2, [tmp_path], timeout=20)
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
