"""The `partition-ooc` benchmark: ``python benchmarks/partition_ooc.py [OPTIONS]`` = ``haloflow bench partition-ooc``.

The code lives in ``haloflow/bench/partition_ooc.py`` so that the installed command can run it too.
"""

import sys

from haloflow.bench.partition_ooc import main

if __name__ == "__main__":
    sys.exit(main())
