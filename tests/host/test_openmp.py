"""haloflow/host/openmp.py: OpenMP's idle threads spin briefly, then sleep, in a process whose entry point applied
haloflow's settings (``haloflow.host.apply()``) before torch loaded.

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


REPORT = ("import json, os; from haloflow.host import openmp as _openmp; print(json.dumps({'spin': os.environ.get('GOMP_SPINCOUNT'), "
          "'wait': os.environ.get('OMP_WAIT_POLICY'), 'policy': _openmp.wait_policy(), "
          "'caller': _openmp.caller_environ().get('GOMP_SPINCOUNT')}))")
HALOFLOWS = {"spin": "10000", "wait": None, "policy": "spin 10,000 pauses, then sleep", "caller": None}


def test_applying_the_settings_before_torch_bounds_the_spin():
    assert _run("import haloflow.host; haloflow.host.apply(); " + REPORT) == HALOFLOWS  # the caller had none


@pytest.mark.parametrize("name, value", [("OMP_WAIT_POLICY", "PASSIVE"), ("GOMP_SPINCOUNT", "300000"),
                                         ("KMP_BLOCKTIME", "0")])
def test_a_choice_in_the_environment_is_left_alone(name, value):
    got = _run("import haloflow.host; haloflow.host.apply(); " + REPORT, **{name: value})
    assert got["spin"] == (value if name == "GOMP_SPINCOUNT" else None)
    assert got["policy"] == f"{name}={value} (the environment's)"


def test_torch_imported_first_keeps_spinning_and_says_so():
    got = _run("import torch, haloflow.host; haloflow.host.apply(); " + REPORT)
    assert got["policy"].startswith("spinning 300,000 pauses (torch was imported before haloflow.host.apply()")


WORKER_SLEEPS = """
import haloflow.host
haloflow.host.apply()
import json, os, time, torch
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
    x.add_(1)  # one parallel region ...
    t = time.perf_counter()
    while time.perf_counter() - t < 0.002:  # ... then 2 ms of the main thread's own (serial) work
        pass
b = per_thread()
main = str(os.getpid())
busiest = max((t for t in b if t != main and t in a), key=lambda t: b[t][0] - a[t][0])
print(json.dumps({'sleeps': b[busiest][1] - a[busiest][1]}))
"""


def test_the_worker_thread_sleeps_in_the_serial_gaps_between_regions():
    """2 ms of serial work after each region: libgomp's default spin (6-9 ms here) would poll through every gap;
    10,000 pauses (0.2-0.3 ms) run out, and the worker sleeps on a futex in each of them."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores for a second OpenMP thread")
    regions = 100
    got = _run(WORKER_SLEEPS.replace("REGIONS", str(regions)))
    assert got["sleeps"] >= regions


def test_a_child_of_haloflow_knows_its_inherited_setting_for_haloflow_s():
    child = ("import subprocess, sys; print(subprocess.run([sys.executable, '-c', " + repr(
        "import torch, haloflow.host; haloflow.host.apply(); " + REPORT) + "], capture_output=True, text=True, "
        "check=True).stdout.strip())")
    assert _run("import haloflow.host; haloflow.host.apply(); " + child) == HALOFLOWS  # torch first: inherited
