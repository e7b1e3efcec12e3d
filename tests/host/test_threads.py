"""haloflow/host/threads.py: the ranks x threads arithmetic said at start-up, and numba's kernels kept at torch's count."""

import logging
import os
import subprocess
import sys
import time

import numba
import pytest
import torch

from haloflow.host.threads import ThreadBudget, ThreadGovernor, cores_here, fitting_threads, follow_torch_threads


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


def test_runtime_governs_unless_fixed_and_only_where_blas_rounds_alike_at_any_count(two_threads, monkeypatch, caplog):
    from haloflow.engine import runtime as runtime_mod
    from haloflow.engine.runtime import Runtime, RuntimeConfig

    with Runtime.start(RuntimeConfig(progress=False, device="cpu", adapt_threads=False), join=False) as rt:
        assert rt.governor is None
        rt.between_units()  # a no-op
    monkeypatch.setattr(runtime_mod, "reproducible_blas", lambda: True)
    with Runtime.start(RuntimeConfig(progress=False, device="cpu"), join=False) as rt:  # the default
        assert isinstance(rt.governor, ThreadGovernor) and rt.governor.limit == 2
    monkeypatch.setattr(runtime_mod, "reproducible_blas", lambda: False)  # MKL ran before the run: mode unset
    with caplog.at_level(logging.INFO, logger="haloflow.engine.runtime"):
        with Runtime.start(RuntimeConfig(progress=False, device="cpu"), join=False) as rt:
            assert rt.governor is None
    assert any("threads stay at 2" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("adapt", [False, True])
def test_a_start_up_beside_busy_processes_warns_when_the_threads_are_fixed(two_threads, caplog, monkeypatch, adapt):
    from haloflow.engine import runtime as runtime_mod
    from haloflow.engine.runtime import Runtime, RuntimeConfig

    monkeypatch.setattr(runtime_mod, "reproducible_blas", lambda: True)
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
        assert len(warned) == 1 and "--fixed-threads" in warned[0] and "of 2 cores busy" in warned[0]


def test_blas_in_a_fresh_process_rounds_alike_at_any_thread_count():
    """MKL's strict mode set before the first product: a long inner dimension (a weight gradient's) gives the same
    bits at 1, 2 and 3 threads; without it MKL splits that dimension by thread count (this test's control)."""
    torch_mkl = pytest.importorskip("torch").backends.mkl.is_available()
    if not torch_mkl:
        pytest.skip("this torch has no MKL: its BLAS has no reproducible mode to set")
    code = ("import sys, torch; from haloflow.host.threads import reproducible_blas\n"
            "ok = reproducible_blas() if sys.argv[1] == 'strict' else None\n"
            "g = torch.Generator().manual_seed(0)\n"
            "a, b = torch.randn(100, 798, generator=g), torch.randn(798, 300, generator=g)\n"
            "out = []\n"
            "for t in (1, 2, 3):\n"
            "    torch.set_num_threads(t); out.append(a @ b)\n"
            "print(ok, all(torch.equal(out[0], o) for o in out[1:]))\n")
    got = {mode: subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, check=True,
                                env={k: v for k, v in os.environ.items() if k != "MKL_CBWR"}).stdout.split()
           for mode in ("strict", "default")}
    assert got["strict"] == ["True", "True"]
    # the control: on the Intel Xeons here MKL's default mode splits that product by thread count ("False"); on
    # another CPU it may not, and the strict mode's result above is the claim
    assert got["default"][0] == "None" and got["default"][1] in ("True", "False")


def test_threads_that_fit_beside_other_processes():
    assert [fitting_threads(2, others) for others in (0.0, 0.25, 0.3, 1.5, 2.0)] == [2, 2, 1, 1, 1]
    assert fitting_threads(16, 3.2) == 13


def test_vector_math_is_warmed_after_the_blas_mode_and_before_any_run():
    """MKL's vector math (torch's sqrt, exp, log, tanh ... on the CPU) picks each function's code path at its first
    call, and two threads making that call at once can end on different paths (a first parallel sqrt 3e-4 off):
    ``warm_vector_math`` makes it on one thread first. It is an MKL call, so ``reproducible_blas`` warms after
    setting the mode, which still takes; the control: a process whose first MKL call was a sqrt cannot take it any
    more. A run with ``--fixed-threads`` (no mode asked) is warmed by ``Runtime.start`` all the same."""
    if not pytest.importorskip("torch").backends.mkl.is_available():
        pytest.skip("this torch has no MKL")
    code = ("import sys, torch; from haloflow.host import threads\n"
            "if sys.argv[1] == 'sqrt-first': torch.full((8,), 0.5).sqrt()\n"
            "if sys.argv[1] == 'fixed-threads':\n"
            "    from haloflow.engine.runtime import Runtime; from haloflow.engine.run_config import RuntimeConfig\n"
            "    Runtime.start(RuntimeConfig(adapt_threads=False, progress=False), join=False)\n"
            "    print(threads._BLAS_REPRODUCIBLE, threads._VECTOR_MATH_WARM)\n"
            "else:\n"
            "    print(threads.reproducible_blas(), threads._VECTOR_MATH_WARM)\n")
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    got = {mode: subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, check=True,
                                env=env).stdout.split() for mode in ("plain", "sqrt-first", "fixed-threads")}
    assert got == {"plain": ["True", "True"], "sqrt-first": ["False", "True"], "fixed-threads": ["None", "True"]}
