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
    ways = _steps(chooser, cost, 3 + 3 + 10 + 3 + 20 + 3 + 40)
    assert ways[:6] == [False] * 3 + [True] * 3  # a probe of each way, inline first
    assert ways[6:16] == [faster] * 10 and ways[16:19] == [not faster] * 3  # held, then the other probed
    assert ways[19:39] == [faster] * 20 and ways[39:42] == [not faster] * 3  # won again: held twice as long
    assert ways[42:] == [faster] * 40
    # The load changes: the held way becomes the slower one. The next probe still compares with its old times
    # (held 80 steps more), the one after with its new ones: the other way wins, and its hold starts again at 10.
    cost = {faster: 3.0, not faster: 2.0}
    ways = _steps(chooser, cost, 3 + 80 + 3 + 10 + 3)
    assert ways == [not faster] * 3 + [faster] * 80 + [not faster] * 3 + [not faster] * 10 + [faster] * 3


def test_the_hold_stops_doubling_at_eight_times():
    _steps.now = 0.0
    chooser = OverlapChooser(probe=2, hold=5, clock=lambda: _steps.now)
    chooser.step()
    ways = _steps(chooser, {False: 1.0, True: 2.0}, 2000)
    holds, run = [], 0
    for w in ways[4:]:  # after the first two probes: runs of the inline way between probes of the thread
        if w:
            if run:
                holds.append(run)
            run = 0
        else:
            run += 1
    assert holds[:5] == [5, 10, 20, 40, 40] and set(holds[4:]) == {40}
