"""The `gcn-dist` benchmark: ``python benchmarks/gcn_dist.py [OPTIONS]`` = ``haloflow bench gcn-dist [OPTIONS]``.

The code lives in ``haloflow/bench/gcn_dist.py`` so that the installed command can run it too.
"""

import sys

from haloflow import host

host.apply()  # as the CLI does, before the benchmark imports torch (haloflow/host/__init__.py)

from haloflow.bench.gcn_dist import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
