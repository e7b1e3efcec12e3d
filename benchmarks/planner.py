"""The `planner` benchmark: ``python benchmarks/planner.py [OPTIONS]`` = ``haloflow bench planner [OPTIONS]``.

The code lives in ``haloflow/bench/planner.py`` so that the installed command can run it too.
"""

import sys

from haloflow import host

host.apply()  # as the CLI does, before the benchmark imports torch (haloflow/host/__init__.py)

from haloflow.bench.planner import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
