"""The `grad-sync` benchmark: ``python benchmarks/grad_sync.py [OPTIONS]`` = ``haloflow bench grad-sync [OPTIONS]``.

The code lives in ``haloflow/bench/grad_sync.py`` so that the installed command can run it too.
"""

import sys

from haloflow.bench.grad_sync import main

if __name__ == "__main__":
    sys.exit(main())
