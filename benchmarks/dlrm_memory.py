"""The `dlrm-memory` benchmark: ``python benchmarks/dlrm_memory.py [OPTIONS]`` = ``haloflow bench dlrm-memory [OPTIONS]``.

The code lives in ``haloflow/bench/dlrm_memory.py`` so that the installed command can run it too.
"""

import sys

from haloflow.bench.dlrm_memory import main

if __name__ == "__main__":
    sys.exit(main())
