"""``python -m torch.distributed.run`` as haloflow's ``--nproc`` launcher runs it: the same agent and rendezvous,
but a failed job ends with the ranks' exit codes written to ``$HALOFLOW_TORCHRUN_REPORT`` (JSON) for the launcher
to name, instead of torchrun's ChildFailedError traceback (the launcher prints one line of its own)::

    {"first": 1, "failures": {"0": {"exitcode": -15, "signal": "SIGTERM"}, "1": {"exitcode": -9, "signal": "SIGKILL"}}}

``first`` is torchrun's root cause: the rank that failed first.
"""

from __future__ import annotations

import json
import logging
import os
import sys

REPORT_ENV = "HALOFLOW_TORCHRUN_REPORT"


def main(argv: list[str] | None = None) -> int:
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)  # the launcher says what failed
    try:
        torchrun.run(torchrun.parse_args(argv))
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
