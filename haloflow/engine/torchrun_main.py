"""``python -m torch.distributed.run`` as haloflow's ``--nproc`` launcher runs it: the same agent and rendezvous,
but a failed job ends with the ranks' exit codes written to ``$HALOFLOW_TORCHRUN_REPORT`` (JSON) for the launcher
to name, instead of torchrun's ChildFailedError traceback (the launcher prints one line of its own)::

    {"first": 1, "failures": {"0": {"exitcode": -15, "signal": "SIGTERM"}, "1": {"exitcode": -9, "signal": "SIGKILL"}}}

``first`` is torchrun's root cause: the rank that failed first. More differences from plain torchrun:

* a signal (the launcher forwarding Ctrl-C or SIGTERM) stops the ranks and ends this agent quietly with status
  128 + signal, not with a SignalException traceback; the agent's own log lines and C++ warnings are not shown
  (``_quiet_agent``), and a failed rendezvous is one line;
* the agent dies with the launcher (``launch.die_with_parent``), and its ranks learn its own pid to die with it;
* every rank of a job sees the same TORCHELASTIC_RESTART_COUNT: the job's attempt, counted in worker groups this
  agent started. torchrun counts only this agent's own failures, so when a rank on node 1 dies, node 1's ranks
  restart as attempt 1 but node 0's, restarted because node 1 rejoined, as attempt 0 again: they read the gloo
  addresses attempt 0 left in the job's store (``runtime._attempt_store``), connect to dead ranks and fail with
  a connectFullMesh traceback, and their checkpointer takes the run for a new one. Every node joins every
  rendezvous round, so the agents' counts agree without asking each other.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import sys

from haloflow.engine.launch import PARENT_ENV, die_with_parent

REPORT_ENV = "HALOFLOW_TORCHRUN_REPORT"
_CPP_LOG_ENV = "TORCH_CPP_LOG_LEVEL"


def main(argv: list[str] | None = None) -> int:
    die_with_parent()  # the launcher gone (even by kill -9): SIGTERM, which stops the ranks as below
    os.environ[PARENT_ENV] = str(os.getpid())  # what the ranks die with
    _quiet_agent()  # before anything imports torch
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError

    _count_attempts_per_job()
    args = torchrun.parse_args(argv)
    try:
        torchrun.run(args)
    except ChildFailedError as err:
        report = os.environ.get(REPORT_ENV)
        if report:
            first, _ = err.get_first_failure()
            failures = {str(rank): {"exitcode": f.exitcode, "signal": f.signal_name() if f.exitcode < 0 else None}
                        for rank, f in err.failures.items()}
            with open(report, "w") as out:
                json.dump({"first": first, "failures": failures}, out)
        else:
            print(f"torchrun: {err.name} failed: ranks {sorted(err.failures)}", file=sys.stderr)
        return 1
    except RendezvousError as err:  # several nodes: node 0 not there (yet), a wrong address, a closed port
        print(f"haloflow: error: the rendezvous at {args.rdzv_endpoint} failed ({type(err).__name__}: {err}); is "
              "node 0 running there, with the same --nnodes?", file=sys.stderr)
        return 1
    except SignalException as err:  # the ranks got the same signal and are gone (torchrun's shutdown)
        return 128 + int(err.sigval)
    except KeyboardInterrupt:  # Ctrl-C before torchrun's own handlers were in place: no rank started yet
        return 130
    return 0


def _quiet_agent() -> None:
    """No log lines from torchrun's agent ("Sending process 123 closing signal SIGTERM", "Received 2 death
    signal"): the launcher says what failed in one line. Each of its loggers sets its own level, so the level of
    their parent would not do; they reach no handler past it instead (the null handler: not Python's last
    resort, which would print them).

    Nor the C++ warnings of its rendezvous store, with their stack frames: at the end of a job of several
    nodes, node 0's agent (which hosts the store) may exit while another agent still closes the rendezvous
    there. libtorch reads TORCH_CPP_LOG_LEVEL as it loads, so it is set for the import (unless the user set
    it) and then taken away again: the ranks log as they would. Errors still show."""
    if _CPP_LOG_ENV not in os.environ:
        os.environ[_CPP_LOG_ENV] = "ERROR"
        import torch  # noqa: F401  (loads libtorch at this level)

        del os.environ[_CPP_LOG_ENV]
    elastic = logging.getLogger("torch.distributed.elastic")
    elastic.addHandler(logging.NullHandler())
    elastic.propagate = False


def _count_attempts_per_job() -> None:
    """Each worker group this agent starts gets TORCHELASTIC_RESTART_COUNT = the groups it started before (see
    the module docstring). One node: the same number torchrun gives. A torch whose agent starts its workers
    otherwise keeps torchrun's own count."""
    from torch.distributed.elastic.agent.server import local_elastic_agent as agent

    start = getattr(agent, "start_processes", None)
    if start is None:
        return
    groups = itertools.count()

    def start_processes(*args, envs, **kwargs):
        attempt = str(next(groups))
        envs = {rank: {**env, "TORCHELASTIC_RESTART_COUNT": attempt} for rank, env in envs.items()}
        return start(*args, envs=envs, **kwargs)

    agent.start_processes = start_processes


if __name__ == "__main__":
    sys.exit(main())
