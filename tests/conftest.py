from pathlib import Path

import numpy as np
import pytest
import torch

from haloflow.data.paths import data_root
from haloflow.engine.launch import launch_torchrun

REPO = Path(__file__).resolve().parents[1]


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
