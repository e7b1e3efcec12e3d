"""haloflow/host/malloc.py: a process whose entry point applied haloflow's settings reuses big freed blocks instead of
faulting fresh pages in.

Each case is a fresh interpreter (mallopt is per process).
"""

import json
import os
import subprocess
import sys

import pytest

FAULTS = """
import json, resource
import haloflow.host, torch
haloflow.host.apply()
from haloflow.host.malloc import malloc_policy
faults = []
for step in range(10):  # a step's activations: 100 MB and 32 MB blocks (above glibc's own 32 MiB threshold)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [torch.empty(n).fill_(1.0) for n in (25_000_000, 8_000_000, 25_000_000, 8_000_000)]
    del blocks
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"policy": malloc_policy(), "faults": sum(faults[5:])}))  # the last 5 steps
"""
PAGES = 100_000_000 // 4096  # pages of one block


def _run(code: str, **env) -> dict:
    base = {k: v for k, v in os.environ.items()
            if not (k.startswith("MALLOC_") or k in ("HALOFLOW_MALLOC", "GLIBC_TUNABLES", "LD_PRELOAD"))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                         env={**base, **env}).stdout
    return json.loads(out.splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_big_blocks_are_reused_not_faulted_in_again():
    got = _run(FAULTS)
    assert got["policy"] == "freed blocks below 1 GiB reused"
    system = _run(FAULTS, HALOFLOW_MALLOC="system")  # the control: glibc unmaps each block on free
    assert system["policy"] == "HALOFLOW_MALLOC=system"
    assert system["faults"] >= 5 * PAGES, system  # blocks faulted in afresh every step (measured ~10 blocks)
    assert got["faults"] <= PAGES // 2, got  # the blocks of the first steps reused (measured 0)


@pytest.mark.parametrize("env, says", [({"MALLOC_MMAP_THRESHOLD_": "65536"}, "MALLOC_MMAP_THRESHOLD_ (the environment's)"),
                                       ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"},
                                        "GLIBC_TUNABLES (the environment's)"),
                                       ({"LD_PRELOAD": "/nonexistent/libjemalloc.so"}, "jemalloc (LD_PRELOAD)")])
def test_a_choice_in_the_environment_is_left_alone(env, says):
    got = _run("import json, haloflow.host; haloflow.host.apply(); from haloflow.host.malloc import malloc_policy; "
               "print(json.dumps({'policy': malloc_policy()}))", **env)
    assert got["policy"] == says
