"""The `partition` benchmark: ``python benchmarks/partition.py [OPTIONS]`` = ``haloflow bench partition [OPTIONS]``.

The code lives in ``haloflow/bench/partition.py`` so that the installed command can run it too.
"""

import sys

from haloflow.bench.partition import main

if __name__ == "__main__":
    sys.exit(main())
