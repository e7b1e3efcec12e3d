"""Shared inputs of the cache tests: tiny tables, so torch runs on one thread (two threads on a shared 2-core
machine wait on each other's barriers: 8 ms per tiny embedding_bag instead of 0.03 ms)."""

import numpy as np
import pytest
import torch

from tests.conftest import one_torch_thread


one_thread = pytest.fixture(autouse=True)(one_torch_thread)


def zipf_batches(rng: np.random.Generator, num_rows: int, steps: int, nnz: int, bags: int, a: float = 1.3):
    """``steps`` batches of (ids (nnz,), offsets (bags,)), ids Zipf-skewed over ``num_rows`` rows."""
    out = []
    for _ in range(steps):
        ids = torch.from_numpy((rng.zipf(a, nnz) - 1) % num_rows).long()
        offsets = torch.from_numpy(np.sort(rng.choice(np.arange(1, nnz), bags - 1, replace=False))).long()
        out.append((ids, torch.cat([torch.zeros(1, dtype=torch.long), offsets])))
    return out
