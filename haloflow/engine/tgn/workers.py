"""A TGN batch on V logical workers: each worker's slice of the batch, and one forward per worker whose weight
gradients meet in the V-tree (``engine/logical.py``).

::

    global batch of B events (chronological)     e0 e1 ... e_{B-1},  negatives n0 .. n_{B-1}
    LogicalWorkers.cut(B), V = 4                 [w0: B0 events][w1: B1][w2: B2][w3: B3]     (depends on V only)
    rank r (K = 2) holds w_{2r}, w_{2r+1}        worker_slices -> [(ids, neg) of w_{2r}, (ids, neg) of w_{2r+1}]

    per worker w (the same at any K):  batch_w = make_tgn_batch(slice w)   its neighbours, its node rows
                                       out_w   = TGN(rows_w, batch_w)      through w's own aliases of the weights
                                       loss_w  = BCE sum of w's events / B
    weight gradient                     tree_sum over this rank's workers (in ``fanout``'s backward), then the
                                        ranks' tree (``grad_sync``): the V-tree (g0 + g1) + (g2 + g3) at any K

Why slices rather than one product over a rank's events: a float32 GEMM rounds a row by the number of rows it is
computed with (3 and 128 rows differ), and a weight gradient sums over the rows it saw, so only per-worker shapes
that do not move with K give the same bits at every K.

Known gap (the kernels', not V's): K = 1 runs 2 threads where K = 2 runs 1 each, and a product ``x @ W^T`` of 2 or
3 rows with the weight transposed in place (``F.linear``, ``addmm(b, x, w.t())``) rounds by the thread count here
even in MKL's reproducible mode (AMD EPYC, torch 2.13; 1 and 4+ rows do not). A slice of 1 event (batches under 4V
events) or a worker with 2-3 mailed rows can meet it; batches of 200 at V = 4 did not in two epochs of Wikipedia.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.func import functional_call

from haloflow.engine.logical import LogicalWorkers, fanout
from haloflow.models.tgn import TGN, TGNBatch, TGNOutput
from haloflow.models.tgn_memory import MemoryRows

__all__ = ["worker_slices", "forward_workers"]


def worker_slices(workers: LogicalWorkers, batch_ids: np.ndarray, neg: np.ndarray
                  ) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(event ids, negatives)`` of each of this rank's workers, in worker order (a slice may be empty: B < V).

    Shapes:
        batch_ids, neg int64 (B,) the whole global batch  ->  V / K pairs of (B_w,), (B_w,).
    """
    bounds = np.concatenate([[0], np.cumsum(workers.cut(batch_ids.shape[0]))])  # (V + 1,)
    return [(batch_ids[bounds[w]:bounds[w + 1]], neg[bounds[w]:bounds[w + 1]]) for w in workers.mine]


def forward_workers(model: TGN, inputs: list[tuple[MemoryRows, TGNBatch] | None]) -> list[TGNOutput | None]:
    """``model(rows_w, batch_w)`` for each of this rank's workers (None: an empty slice, no output), each through
    its own aliases of the weights, so that a weight's gradient is the tree sum of the workers' gradients in worker
    order, an empty worker's counting as zeros (``logical.fanout``): the same tree whichever workers are empty.

    Without gradients (evaluation) or with one worker: plain calls."""
    if len(inputs) == 1 or not torch.is_grad_enabled():
        return [None if x is None else model(*x) for x in inputs]
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    aliases = fanout([model.get_parameter(name) for name in names], len(inputs))
    return [None if x is None else functional_call(model, dict(zip(names, a)), x, strict=False)
            for a, x in zip(aliases, inputs)]
