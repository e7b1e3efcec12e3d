"""The `halo-build` benchmark: ``python benchmarks/halo_build.py [OPTIONS]`` = ``haloflow bench halo-build [OPTIONS]``.

The code lives in ``haloflow/bench/halo_build.py`` so that the installed command can run it too.
"""

import sys

from haloflow.bench.halo_build import main

if __name__ == "__main__":
    sys.exit(main())
