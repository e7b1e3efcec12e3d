"""utils/threads.py: the ranks x threads arithmetic said at start-up, and numba's kernels kept at torch's count."""

import logging
import os
import subprocess
import sys
import time

import numba
import pytest
import torch

from haloflow.utils.threads import ThreadBudget, ThreadGovernor, cores_here, fitting_threads, follow_torch_threads


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


class _Machine:
    """Hand-fed /proc counters for ThreadGovernor: busy ticks of the cores and this process's own ticks."""

    def __init__(self):
        self.now, self.busy, self.mine, self.reads = 0.0, 0, 0, 0

    def read(self, cpus):
        self.reads += 1
        return self.busy, self.mine

    def advance(self, seconds: float, *, others: float, mine: float) -> None:
        """``seconds`` pass with ``others`` cores busy with other processes and ``mine`` with this one (100 Hz)."""
        self.now += seconds
        self.busy += round(100 * seconds * (others + mine))
        self.mine += round(100 * seconds * mine)


@pytest.fixture
def two_threads():
    if cores_here() < 2:
        pytest.skip("needs 2 cores")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)
    follow_torch_threads()


def _governor(machine):
    return ThreadGovernor(2, cpus=frozenset({0, 1}), every_s=0.1, read=machine.read, clock=lambda: machine.now,
                          hz=100)


def test_governor_drops_to_one_thread_after_two_busy_readings_and_comes_back(two_threads):
    m = _Machine()
    gov = _governor(m)
    m.advance(0.2, others=0.0, mine=2.0)
    assert gov.tick() is None and gov.others == pytest.approx(0.0)  # quiet: stays at 2
    m.advance(0.2, others=1.0, mine=1.0)  # two co-tenants took half the cores
    assert gov.tick() is None and gov.others == pytest.approx(1.0)  # one reading could be a burst
    m.advance(0.2, others=1.0, mine=1.0)
    assert gov.tick() == 1 and torch.get_num_threads() == 1
    m.advance(0.2, others=1.4, mine=0.6)
    assert gov.tick() is None  # still busy: stays at 1
    m.advance(0.2, others=0.0, mine=1.0)
    assert gov.tick() is None
    m.advance(0.2, others=0.1, mine=1.0)
    assert gov.tick() == 2 and torch.get_num_threads() == 2 and gov.others == pytest.approx(0.1)


def test_governor_ignores_a_single_burst_and_reads_at_most_every_interval(two_threads):
    m = _Machine()
    gov = _governor(m)
    reads = m.reads
    m.advance(0.05, others=2.0, mine=0.0)
    assert gov.tick() is None and m.reads == reads  # too soon to look
    m.advance(0.1, others=1.5, mine=0.5)
    assert gov.tick() is None  # a burst ...
    m.advance(0.2, others=0.0, mine=2.0)
    assert gov.tick() is None and torch.get_num_threads() == 2  # ... gone by the next look


def test_runtime_governs_only_when_asked(two_threads):
    from haloflow.engine.runtime import Runtime, RuntimeConfig

    with Runtime.start(RuntimeConfig(progress=False, device="cpu"), join=False) as rt:
        assert rt.governor is None
        rt.between_units()  # a no-op
    with Runtime.start(RuntimeConfig(progress=False, device="cpu", adapt_threads=True), join=False) as rt:
        assert isinstance(rt.governor, ThreadGovernor) and rt.governor.limit == 2


@pytest.mark.parametrize("adapt", [False, True])
def test_a_start_up_beside_busy_processes_names_adapt_threads_unless_it_is_on(two_threads, caplog, adapt):
    from haloflow.engine.runtime import Runtime, RuntimeConfig

    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(0.3)  # both spinning: the two cores are theirs
        with caplog.at_level(logging.WARNING, logger="haloflow.engine.runtime"):
            config = RuntimeConfig(progress=False, device="cpu", adapt_threads=adapt)
            with Runtime.start(config, join=False) as rt:
                time.sleep(0.5)  # the run's start-up (data, model) while they spin
                rt.started()
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()
    warned = [r.getMessage() for r in caplog.records if "during start-up" in r.getMessage()]
    if adapt:  # the governor handles it: nothing to advise
        assert warned == []
    else:
        assert len(warned) == 1 and "--adapt-threads" in warned[0] and "of 2 cores busy" in warned[0]


def test_threads_that_fit_beside_other_processes():
    assert [fitting_threads(2, others) for others in (0.0, 0.25, 0.3, 1.5, 2.0)] == [2, 2, 1, 1, 1]
    assert fitting_threads(16, 3.2) == 13
