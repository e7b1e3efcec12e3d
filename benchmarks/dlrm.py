"""The `dlrm` benchmark: ``python benchmarks/dlrm.py [OPTIONS]`` = ``haloflow bench dlrm [OPTIONS]``.

The code lives in ``haloflow/bench/dlrm.py`` so that the installed command can run it too.
"""

import sys

from haloflow.bench.dlrm import main

if __name__ == "__main__":
    sys.exit(main())
