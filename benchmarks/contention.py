"""The `contention` benchmark: ``python benchmarks/contention.py [OPTIONS]`` = ``haloflow bench contention [OPTIONS]``.

The code lives in ``haloflow/bench/contention.py`` so that the installed command can run it too.
"""

import sys

from haloflow.bench.contention import main

if __name__ == "__main__":
    sys.exit(main())
