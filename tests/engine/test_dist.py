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
    assert record["elapsed_s"] < TIMEOUT_S + 10  # the whole run, start-up included: no hang
    if mode == "stalled":
        assert "Timed out waiting 5000ms" in record["error"]  # gloo's own words name the timeout
