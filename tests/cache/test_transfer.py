import threading

import pytest
import torch

from haloflow.cache.transfer import RowMover


def test_runs_the_job_off_the_calling_thread_and_waits():
    mover = RowMover(torch.device("cpu"))
    seen = []
    mover.submit(lambda: seen.append(threading.current_thread().name))
    mover.wait()
    assert seen and seen[0].startswith("haloflow-cache")
    assert not mover.busy
    mover.close()


def test_wait_reraises_the_jobs_error():
    mover = RowMover(torch.device("cpu"))

    def fail():
        raise OSError("disk gone")

    mover.submit(fail)
    with pytest.raises(OSError, match="disk gone"):
        mover.wait()
    mover.wait()  # nothing in flight any more
    mover.close()
