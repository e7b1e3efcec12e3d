"""The `gcn` benchmark: ``python benchmarks/gcn.py [OPTIONS]`` = ``haloflow bench gcn [OPTIONS]``.

The code lives in ``haloflow/bench/gcn.py`` so that the installed command can run it too.
"""

import sys

from haloflow.bench.gcn import main

if __name__ == "__main__":
    sys.exit(main())
