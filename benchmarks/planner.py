"""The `planner` benchmark: ``python benchmarks/planner.py [OPTIONS]`` = ``haloflow bench planner [OPTIONS]``.

The code lives in ``haloflow/bench/planner.py`` so that the installed command can run it too.
"""

import sys

from haloflow.bench.planner import main

if __name__ == "__main__":
    sys.exit(main())
