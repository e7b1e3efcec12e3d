"""haloflow/_openmp.py: OpenMP's idle threads yield in a process that imports haloflow before torch.

Each case is a fresh interpreter: a runtime reads its environment once, as it loads.
"""

import json
import os
import subprocess
import sys

import pytest

CHOSEN = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def _run(code: str, **env) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in CHOSEN}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                         env={**base, **env}).stdout
    return json.loads(out.splitlines()[-1])


REPORT = ("import json, os; from haloflow import _openmp; print(json.dumps({'env': os.environ.get('OMP_WAIT_POLICY'), "
          "'policy': _openmp.wait_policy(), 'caller': _openmp.caller_environ().get('OMP_WAIT_POLICY')}))")


def test_importing_haloflow_first_makes_idle_threads_passive():
    got = _run("import haloflow; " + REPORT)
    assert got == {"env": "PASSIVE", "policy": "passive", "caller": None}  # the caller's own environment had none


@pytest.mark.parametrize("name, value", [("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "10000")])
def test_a_choice_in_the_environment_is_left_alone(name, value):
    got = _run("import haloflow; " + REPORT, **{name: value})
    assert got["env"] == (value if name == "OMP_WAIT_POLICY" else None)
    assert got["policy"] == f"{name}={value} (the environment's)"


def test_torch_imported_first_keeps_spinning_and_says_so():
    got = _run("import torch, haloflow; " + REPORT)
    assert got["policy"].startswith("spinning (torch was imported before haloflow")


WORKER_SLEEPS = """
import haloflow, json, os, torch
torch.set_num_threads(2)
x = torch.ones(4_000_000)
x.add_(1)  # starts the pool

def per_thread():
    out = {}
    for tid in os.listdir('/proc/self/task'):
        with open(f'/proc/self/task/{tid}/stat') as f:
            utime = int(f.read().rsplit(')', 1)[1].split()[11])
        with open(f'/proc/self/task/{tid}/status') as f:
            vol = [int(l.split()[1]) for l in f if l.startswith('voluntary_ctxt_switches')][0]
        out[tid] = (utime, vol)
    return out

a = per_thread()
for _ in range(REGIONS):
    x.add_(1)  # one parallel region each, back to back
b = per_thread()
main = str(os.getpid())
busiest = max((t for t in b if t != main and t in a), key=lambda t: b[t][0] - a[t][0])
print(json.dumps({'sleeps': b[busiest][1] - a[busiest][1]}))
"""


def test_the_worker_thread_sleeps_after_every_parallel_region():
    """Back-to-back regions: a spinning worker (libgomp's default) would poll through the gaps and hardly ever
    sleep; a passive one sleeps on a futex after each of them."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores for a second OpenMP thread")
    regions = 200
    got = _run(WORKER_SLEEPS.replace("REGIONS", str(regions)))
    assert got["sleeps"] >= regions


def test_a_child_of_haloflow_knows_its_inherited_policy_for_haloflow_s():
    child = ("import subprocess, sys; print(subprocess.run([sys.executable, '-c', " + repr("import torch, haloflow; "
             + REPORT) + "], capture_output=True, text=True, check=True).stdout.strip())")
    got = _run("import haloflow; " + child)
    assert got == {"env": "PASSIVE", "policy": "passive", "caller": None}  # torch first, yet passive: inherited
