"""engine/launch: the exact torchrun command line (one node or several) and its errors, a process that dies with its
parent even when the parent is killed with SIGKILL, and real local launches: what each rank sees (rank, world size,
threads, the caller's variables), a failing rank's exit code, a restart after a failure."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from haloflow.engine.launch import PARENT_ENV, NodeLayout, launch_torchrun, torchrun_command
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


def test_command_for_two_nodes_meets_at_c10d_hosted_by_node_0():
    for rank in (0, 1):
        nodes = NodeLayout(nnodes=2, node_rank=rank, rdzv_endpoint="10.0.0.1:29400")
        assert torchrun_command(1, ["x.py"], nodes=nodes) == [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", "10.0.0.1:29400", "--rdzv-conf", f"is_host={int(rank == 0)}", "--nproc-per-node", "1",
            "x.py"]
    assert torchrun_command(1, ["x.py"], nodes=NodeLayout()) == torchrun_command(1, ["x.py"])  # --standalone


@pytest.mark.parametrize("nodes, message", [
    ({"nnodes": 0}, "--nnodes must be >= 1, got 0"),
    ({"nnodes": 2, "node_rank": -1, "rdzv_endpoint": "h:1"}, r"--node-rank -1 is not one of the 2 nodes \(0 .. 1\)"),
    ({"node_rank": 1}, r"--node-rank 1 is not one of the 1 nodes \(0 .. 0\)"),
    ({"nnodes": 3}, "--nnodes 3 needs --rdzv-endpoint HOST:PORT"),
    ({"rdzv_endpoint": "h:1"}, "--rdzv-endpoint is where several nodes meet"),
    ({"nnodes": 2, "rdzv_endpoint": "h:0"}, "--rdzv-endpoint must be HOST:PORT with a port in 1 .. 65535, got 'h:0'"),
    ({"nnodes": 2, "rdzv_endpoint": ":80"}, "--rdzv-endpoint must be HOST:PORT"),
])
def test_bad_node_layouts_are_config_errors_naming_the_flag(nodes, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        NodeLayout(**nodes)


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


# A parent that starts a child which asks to die with it (die_with_parent), prints the child's pid once the child
# is ready, and waits; killed with SIGKILL, it can tell the child nothing.
PARENT = f"""
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "from haloflow.engine.launch import die_with_parent; "
                          "die_with_parent(); print('ready', flush=True); import time; time.sleep(120)"],
                         stdout=subprocess.PIPE, text=True, env={{**os.environ, {PARENT_ENV!r}: str(os.getpid())}})
assert child.stdout.readline() == "ready\\n"
print(child.pid, flush=True)
time.sleep(120)
"""


def _gone(pid: int) -> bool:
    """No such process, or a zombie (it exited; whoever adopted it has not reaped it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_a_process_dies_with_its_parent_even_one_killed_by_sigkill():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, cwd=REPO)
    child = int(parent.stdout.readline())
    assert not _gone(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while not _gone(child):
        assert time.monotonic() < deadline, f"pid {child} outlived its parent by 10 s"
        time.sleep(0.05)
