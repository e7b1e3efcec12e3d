"""The `dlrm-memory` benchmark: ``python benchmarks/dlrm_memory.py [OPTIONS]`` = ``haloflow bench dlrm-memory [OPTIONS]``.

The code lives in ``haloflow/bench/dlrm_memory.py`` so that the installed command can run it too.
"""

import sys

from haloflow import host

host.apply()  # as the CLI does, before the benchmark imports torch (haloflow/host/__init__.py)

from haloflow.bench.dlrm_memory import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
