"""The `partition-budget` benchmark: ``python benchmarks/partition_budget.py [OPTIONS]`` = ``haloflow bench
partition-budget [OPTIONS]``.

The code lives in ``haloflow/bench/partition_budget.py`` so that the installed command can run it too.
"""

import sys

from haloflow.bench.partition_budget import main

if __name__ == "__main__":
    sys.exit(main())
