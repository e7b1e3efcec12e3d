"""A run's numbers do not depend on its thread count, so the thread governor (on by default) changes only the time.

Each family trains the contention bench's steps (shapes where the causes showed: weight gradients over 20,000
nodes or 2,048 samples, whose long inner dimension MKL splits by thread count unless in its reproducible mode,
and TGN's GRU gates over more elements than one thread's share, whose vector and scalar sigmoid round apart) in a
fresh process at 1, 2 and (where the cores allow) 4 threads, and the trained state must be the same bits."""

import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.slow

SCRIPT = """
import hashlib, sys, torch
from haloflow.bench.contention_steps import SIZES, _HALOFLOW
from haloflow.engine.run_config import RuntimeConfig

def tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, dict):
        for k in sorted(x, key=str):
            yield from tensors(x[k])
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from tensors(v)
    elif hasattr(x, "__dataclass_fields__"):
        for k in x.__dataclass_fields__:
            yield from tensors(getattr(x, k))

for name, units in (("gcn", 4), ("dlrm", 12), ("tgn", 25)):
    step, rt, family = _HALOFLOW[name](SIZES["small"], 0, RuntimeConfig(device="cpu", progress=False))
    for _ in range(units):
        step()
    exported = family.export()
    h = hashlib.sha256()
    for t in tensors((exported.state, exported.pieces)):
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    print(name, h.hexdigest(), torch.get_num_threads())
    rt.close()
"""


def _digests(threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    env["OMP_NUM_THREADS"] = str(threads)
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line.split() for line in out.stdout.splitlines() if len(line.split()) == 3]
    assert [int(t) for _, _, t in rows] == [threads] * 3  # each ran at the count asked for
    return {name: digest for name, digest, _ in rows}


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="this torch has no MKL, whose mode makes it so")
def test_gcn_dlrm_and_tgn_train_the_same_bits_at_any_thread_count():
    from haloflow.host.threads import cores_here

    one = _digests(1)
    assert set(one) == {"gcn", "dlrm", "tgn"}
    for threads in sorted({2, min(4, cores_here())} - {1}):
        assert _digests(threads) == one, f"{threads} threads"
