"""haloflow/host/__init__.py: ``import haloflow`` changes no process setting; the entry points apply them.

Each case is a fresh interpreter: what a process's OpenMP runtime and allocator were given shows only there.
"""

import json
import os
import subprocess
import sys

import pytest

CHOSEN = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "HALOFLOW_OPENMP_DEFAULTS", "HALOFLOW_MALLOC",
          "GLIBC_TUNABLES", "LD_PRELOAD", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")

# what the process holds: the environment its OpenMP runtime reads, whether glibc reuses freed big blocks (page
# faults of repeated steps: mmap and unmap under glibc's default, the heap after haloflow's mallopt), torch's threads
STATE = """
import json, os, resource
import torch
def mapped_fresh():  # a step's activations, as in test_malloc.py: faults of the last 5 of 10 steps
    faults = 0
    for step in range(10):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        blocks = [torch.empty(n).fill_(1.0) for n in (25_000_000, 8_000_000, 25_000_000, 8_000_000)]
        del blocks
        faults += (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) if step >= 5 else 0
    return faults
print(json.dumps({"spin": os.environ.get("GOMP_SPINCOUNT"), "threads": torch.get_num_threads(),
                  "faults": mapped_fresh()}))
"""


def _run(code: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in CHOSEN}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=180,
                         env=env).stdout
    return json.loads(out.splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_importing_haloflow_changes_no_process_setting():
    plain = _run(STATE)
    imported = _run("import haloflow, haloflow.models.tgn, haloflow.kernels, haloflow.engine.runtime\n"
                    "haloflow.kernels.registry()\n" + STATE)
    assert imported["spin"] is None and imported["threads"] == plain["threads"]
    assert imported["faults"] >= 5 * 24_000, imported  # glibc's own threshold: blocks unmapped, faulted in again
    # the control: after the entry point's apply(), the same steps reuse the freed blocks
    applied = _run("import haloflow.host; haloflow.host.apply()\n" + STATE)
    assert applied["spin"] == "10000" and applied["threads"] == plain["threads"]
    assert applied["faults"] <= 12_000, applied


def test_the_command_line_applies_them_before_torch_loads():
    code = ("import sys, haloflow.cli, haloflow.host.openmp as o, haloflow.host.malloc as m\n"
            "sys.argv = ['haloflow', '--help']\n"
            "try:\n    haloflow.cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "import json; print(json.dumps({'policy': o.wait_policy(), 'malloc': m.malloc_policy()}))")
    got = _run(code)
    assert got == {"policy": "spin 10,000 pauses, then sleep", "malloc": "freed blocks below 1 GiB reused"}
