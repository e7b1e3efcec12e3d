"""The `tgn` benchmark: ``python benchmarks/tgn.py [OPTIONS]`` = ``haloflow bench tgn [OPTIONS]``.

The code lives in ``haloflow/bench/tgn.py`` so that the installed command can run it too.
"""

import sys

from haloflow.bench.tgn import main

if __name__ == "__main__":
    sys.exit(main())
