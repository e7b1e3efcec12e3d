"""Runtime.start's start-up line: ranks x threads against the cores, how idle threads wait, how freed memory is
reused, and a warning with the fitting setting when the threads outnumber the cores. (Beside test_runtime.py, which covers the rest.)"""

import logging

import torch

from haloflow.host.malloc import malloc_policy
from haloflow.host.openmp import wait_policy
from haloflow.engine.runtime import Runtime, RuntimeConfig
from haloflow.host.threads import cores_here, follow_torch_threads


def test_start_says_ranks_x_threads_on_the_cores(caplog):
    caplog.set_level(logging.INFO, logger="haloflow.engine.runtime")
    with Runtime.start(RuntimeConfig(progress=False, device="cpu"), join=False) as rt:
        budget = rt.thread_budget
    assert (budget.ranks, budget.threads, budget.cores) == (1, torch.get_num_threads(), cores_here())
    line = f"{budget.describe()}; OpenMP threads wait: {wait_policy()}; memory: {malloc_policy()}"
    assert line in caplog.messages and malloc_policy() == "freed blocks below 1 GiB reused"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_more_threads_than_cores_is_a_warning_naming_the_fit(caplog):
    before = torch.get_num_threads()
    cores = cores_here()
    try:
        torch.set_num_threads(cores + 1)
        follow_torch_threads()
        with caplog.at_level(logging.WARNING, logger="haloflow.engine.runtime"):
            Runtime.start(RuntimeConfig(progress=False, device="cpu"), join=False).close()
    finally:
        torch.set_num_threads(before)
        follow_torch_threads()
    assert caplog.messages == [f"oversubscribed: 1 x {cores + 1} = {cores + 1} threads > {cores} cores: set "
                               f"OMP_NUM_THREADS={cores} (cores // ranks), or start fewer ranks"]
