import errno
import os
import shutil
import stat
import subprocess
import threading
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

from haloflow.data.paths import data_root
from haloflow.engine.launch import launch_torchrun

REPO = Path(__file__).resolve().parents[1]

# The suite runs on two workers (pyproject: -n 2): the longest tests go first, so that they overlap the many short
# ones instead of leaving one worker alone at the end (seconds in the suite on the 2-core VM, 2026-12-06). An entry
# without "::" is a whole module whose tests share a module-scoped fixture (the runs they compare): its tests stay
# together, in their own order, so that one worker builds the fixture once. A renamed test only loses its place.
LONG_FIRST = (
    "tests/test_readme.py::test_readme_blocks_run",  # 176 s alone, 265 s in the suite
    "tests/bench/device/test_check.py::test_the_script_runs_every_part_at_tiny_sizes_on_a_cpu",  # 221 s
    "tests/engine/dlrm/test_exact.py",  # 2 x 65 s of runs, 3 resumes, a control
    "tests/engine/gcn/test_exact_at_any_k.py",  # Cora 73 s, 20,000 nodes 39 s, resumes, a control
    "tests/engine/tgn/test_k_invariance.py",  # 56 s of runs, 3 resumes, a control
    "tests/cli/test_predict.py::test_tgn_predicts_what_its_trainer_evaluated",  # each 40-60 s: train at K = 2,
    "tests/cli/test_predict.py::test_dlrm_predicts_what_its_trainer_evaluated",  # export, predict at 1 and 2
    "tests/cli/test_predict.py::test_gcn_predicts_what_its_trainer_evaluated",
    "tests/cli/test_runtime_args.py::test_two_nodes_train_as_one_and_recover_from_a_killed_rank_without_a_traceback",
    "tests/cli/test_recovery.py::test_gcn_recovers_from_a_killed_rank_bit_for_bit",
    "tests/cli/test_recovery.py::test_dlrm_recovers_from_a_killed_rank_bit_for_bit",
    "tests/engine/dlrm/test_train.py::test_k_1_and_2_log_equal_losses_at_every_one_of_200_steps",  # 27 s
    "tests/bench/test_contention.py::test_a_tiny_run_prints_the_table_and_writes_every_row",  # 23 s
)


def pytest_collection_modifyitems(session, config, items):
    place = {name: i for i, name in enumerate(LONG_FIRST)}

    def rank(item) -> int:
        return place.get(item.nodeid, place.get(item.nodeid.split("::")[0], len(place)))

    items.sort(key=rank)  # stable: a module's tests, and the rest, keep their order


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data folder (../shared/data or $HALOFLOW_DATA); tests that need it skip when it is missing."""
    root = data_root()
    if not root.is_dir():
        pytest.skip(f"real data folder {root} not found (set HALOFLOW_DATA)")
    return root


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def one_torch_thread():
    """Torch on one thread for the block (tiny tables: two threads on a shared 2-core machine wait on each
    other's barriers, 8 ms per tiny embedding_bag instead of 0.03 ms). Wrap it as a fixture where needed."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run_torchrun(script: Path | str, nproc: int, args: list[str] = (), timeout: float = 300, env: dict | None = None):
    """Run ``script`` under ``torchrun --nproc-per-node nproc`` as real processes; returns CompletedProcess.

    Each rank gets OMP_NUM_THREADS=1 so K ranks share the 2 cores of a CI machine without oversubscription.
    """
    return launch_torchrun(nproc, [script, *args], threads_per_rank=1, env={"PYTHONUNBUFFERED": "1", **(env or {})},
                           capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 1 MiB tmpfs at ``tmp_path / "full"``, unmounted after the test: a disk to fill. Skips where mounting is
    not allowed (not root, or a container without CAP_SYS_ADMIN)."""
    where = tmp_path / "full"
    where.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command here: cannot make a small tmpfs")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a 1 MiB tmpfs here (needs root and CAP_SYS_ADMIN): {proc.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill_disk(where: Path, leave: int) -> None:
    """Fill the file system of ``where`` with one file (``where / "filler"``) until ``leave`` bytes are free."""
    free = shutil.disk_usage(where).free
    with open(where / "filler", "wb") as f:
        f.write(b"\0" * max(0, free - leave))


@pytest.fixture
def device_nodes(tmp_path):
    """Our own copies of /dev/null and /dev/full (same device numbers) under ``tmp_path``, so that a test that
    points an output at a device can never harm the machine's. Skips where device nodes cannot be made."""
    nodes = {}
    for name, minor in (("null", 3), ("full", 7)):
        path = tmp_path / f"dev-{name}"
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
            with open(path, "wb"):
                pass
        except OSError as err:  # not root, or a file system mounted nodev
            pytest.skip(f"cannot make a device node under {tmp_path}: {err}")
        nodes[name] = path
    return nodes


@contextmanager
def reading_fifo(path: Path):
    """Make a FIFO at ``path`` and read it to its end in a thread; yields the list its bytes are appended to. On
    exit a reader still waiting for a writer (the code under test never opened the FIFO) is released, so that a
    failing test cannot hang the session."""
    os.mkfifo(path)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(Path(path).read_bytes()), daemon=True)
    reader.start()
    try:
        yield got
    finally:
        for _ in range(3000):  # about 30 s at most
            if not reader.is_alive():
                break
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # the waiting reader sees an empty stream
            except OSError as err:
                if err.errno != errno.ENXIO:  # ENXIO: the reader has not opened it yet
                    raise
            reader.join(timeout=0.01)
