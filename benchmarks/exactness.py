"""The `exactness` benchmark: ``python benchmarks/exactness.py [OPTIONS]`` = ``haloflow bench exactness [OPTIONS]``.

The code lives in ``haloflow/bench/exactness.py`` so that the installed command can run it too.
"""

import sys

from haloflow import host

host.apply()  # as the CLI does, before the benchmark imports torch (haloflow/host/__init__.py)

from haloflow.bench.exactness import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
