"""The `cache` benchmark: ``python benchmarks/cache.py [OPTIONS]`` = ``haloflow bench cache [OPTIONS]``.

The code lives in ``haloflow/bench/cache.py`` so that the installed command can run it too.
"""

import sys

from haloflow.bench.cache import main

if __name__ == "__main__":
    sys.exit(main())
