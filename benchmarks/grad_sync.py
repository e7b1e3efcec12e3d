"""The `grad-sync` benchmark: ``python benchmarks/grad_sync.py [OPTIONS]`` = ``haloflow bench grad-sync [OPTIONS]``.

The code lives in ``haloflow/bench/grad_sync.py`` so that the installed command can run it too.
"""

import sys

from haloflow import host

host.apply()  # as the CLI does, before the benchmark imports torch (haloflow/host/__init__.py)

from haloflow.bench.grad_sync import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
