"""utils/threads.py: the ranks x threads arithmetic said at start-up, and numba's kernels kept at torch's count."""

import os

import numba
import pytest
import torch

from haloflow.utils.threads import ThreadBudget, cores_here, follow_torch_threads


def test_budget_reads_as_the_arithmetic():
    assert ThreadBudget(ranks=2, threads=1, cores=2).describe() == "2 ranks x 1 thread = 2 threads on 2 cores"
    assert ThreadBudget(ranks=1, threads=1, cores=1).describe() == "1 rank x 1 thread = 1 thread on 1 core"


def test_more_threads_than_cores_is_oversubscribed_and_the_advice_names_the_fit():
    fits, over = ThreadBudget(ranks=2, threads=1, cores=2), ThreadBudget(ranks=2, threads=2, cores=2)
    assert not fits.oversubscribed and fits.advice() == ""
    assert over.oversubscribed and over.total == 4
    assert over.advice() == ("2 x 2 = 4 threads > 2 cores: set OMP_NUM_THREADS=1 (cores // ranks), or start fewer "
                             "ranks")
    assert "OMP_NUM_THREADS=1 " in ThreadBudget(ranks=3, threads=1, cores=2).advice()  # never 0


def test_cores_are_the_affinity_mask():
    assert cores_here() == len(os.sched_getaffinity(0))


def test_numba_follows_torch_and_torch_keeps_its_count():
    if cores_here() < 2:
        pytest.skip("needs 2 cores to tell 1 thread from all")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        follow_torch_threads()
        assert torch.get_num_threads() == 1 and numba.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
        follow_torch_threads()
