"""The `halo-build` benchmark: ``python benchmarks/halo_build.py [OPTIONS]`` = ``haloflow bench halo-build [OPTIONS]``.

The code lives in ``haloflow/bench/halo_build.py`` so that the installed command can run it too.
"""

import sys

from haloflow import host

host.apply()  # as the CLI does, before the benchmark imports torch (haloflow/host/__init__.py)

from haloflow.bench.halo_build import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
