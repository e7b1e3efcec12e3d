import threading

import pytest
import torch

from haloflow.cache.transfer import OverlapChooser, RowMover


def test_runs_the_job_off_the_calling_thread_and_waits():
    mover = RowMover(torch.device("cpu"), overlap=True)
    seen = []
    mover.submit(lambda: seen.append(threading.current_thread().name))
    mover.wait()
    assert seen and seen[0].startswith("haloflow-cache")
    assert not mover.busy
    mover.close()


@pytest.mark.parametrize("overlap", [True, False])
def test_wait_reraises_the_jobs_error(overlap):
    mover = RowMover(torch.device("cpu"), overlap=overlap)

    def fail():
        raise OSError("disk gone")

    mover.submit(fail)  # inline, the job has failed already, but the error comes where a background one's would
    with pytest.raises(OSError, match="disk gone"):
        mover.wait()
    mover.wait()  # nothing in flight any more
    mover.close()


def test_inline_jobs_run_on_the_calling_thread():
    mover = RowMover(torch.device("cpu"), overlap=False)
    seen = []
    mover.submit(lambda: seen.append(threading.current_thread().name))
    assert seen == ["MainThread"]
    mover.wait()
    mover.close()


def _steps(chooser, cost, n):
    """``n`` training steps, each with one job; a step takes cost[background] seconds of the fake clock."""
    ways = []
    for _ in range(n):
        ways.append(chooser.job())
        _steps.now += cost[ways[-1]]
        chooser.step()
    return ways


@pytest.mark.parametrize("faster", [True, False])
def test_the_chooser_holds_the_faster_way_and_probes_the_other_again(faster):
    _steps.now = 0.0
    chooser = OverlapChooser(probe=3, hold=10, clock=lambda: _steps.now)
    chooser.step()  # the first step begins
    cost = {faster: 1.0, not faster: 2.0}
    ways = _steps(chooser, cost, 3 + 3 + 10 + 3 + 10)
    assert ways[:6] == [False] * 3 + [True] * 3  # a probe of each way, inline first
    assert ways[6:16] == [faster] * 10 and ways[16:19] == [not faster] * 3 and ways[19:] == [faster] * 10
    # The load changes: the held way becomes the slower one. The next probe still compares with its old times,
    # the one after with its new ones, and the other way is held from then on.
    cost = {faster: 3.0, not faster: 2.0}
    ways = _steps(chooser, cost, 3 + 10 + 3 + 10)
    assert ways == [not faster] * 3 + [faster] * 10 + [not faster] * 3 + [not faster] * 10
