"""The `readers` benchmark: ``python benchmarks/readers.py [OPTIONS]`` = ``haloflow bench readers [OPTIONS]``.

The code lives in ``haloflow/bench/readers.py`` so that the installed command can run it too.
"""

import sys

from haloflow.bench.readers import main

if __name__ == "__main__":
    sys.exit(main())
