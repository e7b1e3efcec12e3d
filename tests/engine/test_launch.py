"""engine/launch: the exact torchrun command line and its errors, and real local launches: what each rank sees
(rank, world size, threads, the caller's variables), a failing rank's exit code, a restart after a failure."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from haloflow.engine.launch import launch_torchrun, torchrun_command
from haloflow.errors import ConfigError
from tests.conftest import REPO
from tests.engine.scripts.launch_env import FAIL_CODE

SCRIPT = Path(__file__).parent / "scripts" / "launch_env.py"
MODULE = "tests.engine.scripts.launch_env"


def _records(out: Path, nproc: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


def test_command_is_torchrun_standalone_with_the_target_as_strings():
    assert torchrun_command(2, [Path("train.py"), "--epochs", 3]) == [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "train.py", "--epochs", "3"]


def test_command_with_restarts_and_a_report_runs_torchrun_main():
    assert torchrun_command(1, ["-m", "haloflow.cli", "train"], max_restarts=2, report=True) == [
        sys.executable, "-m", "haloflow.engine.torchrun_main", "--standalone", "--nproc-per-node", "1",
        "--max-restarts", "2", "-m", "haloflow.cli", "train"]
    # no restarts: no flag at all (torchrun's own default)
    assert "--max-restarts" not in torchrun_command(1, ["x.py"], max_restarts=0)


@pytest.mark.parametrize("nproc, max_restarts, message", [
    (0, 0, "--nproc must be >= 1, got 0"),
    (-2, 0, "--nproc must be >= 1, got -2"),
    (2, -1, "--max-restarts must be >= 0, got -1"),
])
def test_bad_counts_are_config_errors_naming_the_flag(tmp_path, nproc, max_restarts, message):
    with pytest.raises(ConfigError, match=f"^{message}$"):
        torchrun_command(nproc, ["x.py"], max_restarts=max_restarts)
    with pytest.raises(ConfigError, match=f"^{message}$"):  # refused before anything starts
        launch_torchrun(nproc, [SCRIPT, tmp_path, "ok"], max_restarts=max_restarts)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_each_rank_sees_its_rank_the_threads_and_the_callers_variables(tmp_path):
    proc = launch_torchrun(2, ["-m", MODULE, tmp_path, "ok", "x", "--flag"], threads_per_rank=3,
                           env={"HALOFLOW_TEST_VALUE": "a b=c"}, capture_output=True, text=True, timeout=120,
                           cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.args[:3] == [sys.executable, "-m", "torch.distributed.run"]
    for r, rec in enumerate(_records(tmp_path, 2)):
        assert rec["env"] == {"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "OMP_NUM_THREADS": "3",
                              "HALOFLOW_TEST_VALUE": "a b=c", "TORCHELASTIC_RESTART_COUNT": "0"}
        assert rec["args"] == ["x", "--flag"]


@pytest.mark.slow
@pytest.mark.parametrize("caller_threads", [None, "5"])
def test_threads_default_to_the_callers_setting_else_the_cores_shared(tmp_path, monkeypatch, caller_threads):
    if caller_threads is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        expected = str(max(1, (os.cpu_count() or 1) // 1))  # one rank: all the cores
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", caller_threads)
        expected = caller_threads
    proc = launch_torchrun(1, [SCRIPT, tmp_path, "ok"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _records(tmp_path, 1)[0]["env"]["OMP_NUM_THREADS"] == expected


@pytest.mark.slow
def test_a_failing_rank_is_reported_as_json_and_check_raises(tmp_path):
    report = tmp_path / "report.json"
    with pytest.raises(subprocess.CalledProcessError) as err:
        launch_torchrun(2, [SCRIPT, tmp_path, "fail"], threads_per_rank=1, report=True, check=True,
                        env={"HALOFLOW_TORCHRUN_REPORT": str(report)}, capture_output=True, text=True, timeout=120,
                        cwd=REPO)
    assert err.value.returncode == 1
    assert "Traceback" not in err.value.stderr  # the report replaces torchrun's traceback
    # rank 0 exited 0 before rank 1 failed: rank 1's is the only failure
    assert json.loads(report.read_text()) == {"first": 1, "failures": {"1": {"exitcode": FAIL_CODE, "signal": None}}}


@pytest.mark.slow
def test_max_restarts_restarts_every_rank_after_a_failure(tmp_path):
    proc = launch_torchrun(2, [SCRIPT, tmp_path, "flaky"], threads_per_rank=1, max_restarts=1, capture_output=True,
                           text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [rec["env"]["TORCHELASTIC_RESTART_COUNT"] for rec in _records(tmp_path, 2)] == ["1", "1"]
