"""The `gcn-dist` benchmark: ``python benchmarks/gcn_dist.py [OPTIONS]`` = ``haloflow bench gcn-dist [OPTIONS]``.

The code lives in ``haloflow/bench/gcn_dist.py`` so that the installed command can run it too.
"""

import sys

from haloflow.bench.gcn_dist import main

if __name__ == "__main__":
    sys.exit(main())
