"""Weight-gradient synchronisation in buckets: a fixed-order reduce-scatter, then an all-gather, O(P) per rank.

Every rank holds a full copy of the (small, dense) weights; each computes the gradient of its share of the loss
(already divided by the *global* count), so the true gradient is the plain sum over ranks.

Buckets follow the reverse order of ``parameters()`` (the order backward produces them)::

    params   p0 p1 p2 p3 p4 p5          (forward order)
    buckets  [p5 p4] [p3 p2 p1] [p0]     each at most ``bucket_bytes``, and at most 1/min_buckets of all the
                                         weights, so that more than one bucket launches during backward
    flat     bucket b: (n,) floats, cut into K chunks c_0 .. c_{K-1} (sizes differ by at most one)

    hook(p)  copy p.grad into its bucket; when the bucket is full, launch its reduce-scatter (buckets launch
             strictly in index order, so every rank issues the same collectives in the same order):
               all_to_all: chunk q of my bucket -> rank q            rank r receives (K, c_r): chunk r of everyone
    wait()   per bucket: wait, sum the K rows by the pairwise tree over ranks, (r0 + r1) + (r2 + r3)
             (bit-identical on every rank, every run; with V logical workers, the upper levels of the V-tree
             whose lower levels each rank summed: ``engine/logical.py``), launch the all-gather of the summed chunk (an all-to-all that sends it to every rank, straight
             into the flat bucket); then wait for every gather and write the sums into p.grad

Bytes a rank sends per bucket of n floats: (n - c_r) in the reduce-scatter and (K-1) c_r in the all-gather,
``2 n (K-1) / K`` floats for equal chunks - the ring all-reduce's volume, instead of an all-gather's ``(K-1) n``.
Both phases are all-to-alls with uneven splits, so they run on gloo (which has no reduce-scatter) and on NCCL.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from haloflow.engine.comm import CommStats, wait_work
from haloflow.engine.logical import tree_sum
from haloflow.engine.run_config import GradSyncConfig

__all__ = ["GradSyncConfig", "BucketedGradSync", "chunk_sizes", "sync_bytes"]

log = logging.getLogger(__name__)


def chunk_sizes(n: int, k: int) -> list[int]:
    """``n`` elements cut into ``k`` chunks whose sizes differ by at most one, the larger first."""
    q, r = divmod(n, k)
    return [q + (p < r) for p in range(k)]


def sync_bytes(bucket_sizes, world_size: int, rank: int, elem_size: int = 4) -> int:
    """Bytes rank ``rank`` sends in one step for buckets of these element counts (reduce-scatter + all-gather)."""
    total = 0
    for n in bucket_sizes:
        c = chunk_sizes(int(n), world_size)[rank]
        total += (int(n) - c) + (world_size - 1) * c
    return total * elem_size if world_size > 1 else 0


@dataclass(eq=False)
class _Bucket:
    params: list[nn.Parameter]
    offsets: list[int]  # start of each parameter in ``flat``
    flat: torch.Tensor  # (n,): the local gradients, then (after the all-gather) the sums
    chunks: list[int]  # K chunk sizes of ``flat``
    received: torch.Tensor  # (K * c_r,): chunk r of every rank, in rank order
    ready: int = 0
    work: object | None = None  # the reduce-scatter, then the all-gather
    seen: set = field(default_factory=set)


class _WeakHook:
    """Post-accumulate-grad hook that forwards to a sync object through a weak reference."""

    def __init__(self, sync: "BucketedGradSync"):
        self._ref = weakref.ref(sync)

    def __call__(self, p: nn.Parameter) -> None:
        sync = self._ref()
        if sync is not None:
            sync._on_grad(p)


class BucketedGradSync:
    """Sum gradients over the ranks of ``group``, overlapped with backward (see the module docstring).

    Call ``wait()`` after ``loss.backward()`` and before ``optimizer.step()``. One backward per step.
    With ``group=None`` (single process) it does nothing. ``launched_in_backward`` counts the buckets whose
    reduce-scatter started from a gradient hook in the last step (the rest start in ``wait``).
    """

    def __init__(self, params, group=None, config: GradSyncConfig | None = None, stats: CommStats | None = None,
                 *, kind: str = "grad"):
        self.config = config or GradSyncConfig()
        self.kind = kind  # the key of its bytes and blocked time in ``stats``
        self.group = group
        self.stats = stats
        self.params = [p for p in params if p.requires_grad]
        self.world = dist.get_world_size(group) if group is not None else 1
        self.rank = dist.get_rank(group) if group is not None else 0
        self.buckets: list[_Bucket] = []
        self._bucket_of: dict[int, tuple[int, int]] = {}  # id(param) -> (bucket index, position)
        self._next_launch = 0
        self._handles = []
        self.launched_in_backward = 0  # of the last step
        self._hook_launches = 0
        if group is None:
            return
        self._build_buckets()
        # The hooks hold this object weakly: a strong reference would make a cycle (parameter -> hook -> sync ->
        # parameter) that keeps the process group alive until interpreter shutdown, and gloo then aborts
        # ("terminate called without an active exception") in a few runs in ten.
        hook = _WeakHook(self)
        for p in self.params:
            self._handles.append(p.register_post_accumulate_grad_hook(hook))

    def _build_buckets(self) -> None:
        total = sum(p.numel() * p.element_size() for p in self.params)
        cap = min(self.config.bucket_bytes, -(-total // self.config.min_buckets))
        groups: list[list[nn.Parameter]] = []
        size = 0
        for p in reversed(self.params):
            nbytes = p.numel() * p.element_size()
            if not groups or size + nbytes > cap:
                groups.append([])
                size = 0
            groups[-1].append(p)
            size += nbytes
        for b, plist in enumerate(groups):
            offsets, n = [], 0
            for i, p in enumerate(plist):
                offsets.append(n)
                n += p.numel()
                self._bucket_of[id(p)] = (b, i)
            dtype, device = plist[0].dtype, plist[0].device
            chunks = chunk_sizes(n, self.world)
            flat = torch.zeros(n, dtype=dtype, device=device)
            received = torch.empty(self.world * chunks[self.rank], dtype=dtype, device=device)
            self.buckets.append(_Bucket(plist, offsets, flat, chunks, received))
        log.debug("gradient sync: %d buckets of %s parameters", len(self.buckets), [len(g) for g in groups])

    # ------------------------------------------------------------------------------------------ hooks
    def _on_grad(self, p: nn.Parameter) -> None:
        b, i = self._bucket_of[id(p)]
        bucket = self.buckets[b]
        if i in bucket.seen:
            raise RuntimeError("a parameter's gradient was accumulated twice before wait(): one backward per step")
        bucket.seen.add(i)
        off = bucket.offsets[i]
        bucket.flat[off : off + p.numel()].copy_(p.grad.reshape(-1))
        bucket.ready += 1
        while self._next_launch < len(self.buckets):
            nxt = self.buckets[self._next_launch]
            if nxt.ready < len(nxt.params):
                return
            self._reduce_scatter(nxt)
            self._next_launch += 1
            self._hook_launches += 1

    # ------------------------------------------------------------------------------------------ the two phases
    def _all_to_all(self, out, send, recv_splits, send_splits):
        if self.stats is not None:
            sent = sum(n for q, n in enumerate(send_splits) if q != self.rank)
            self.stats.record(self.kind, sent * send.element_size())
        return dist.all_to_all_single(out, send, recv_splits, send_splits, group=self.group, async_op=True)

    def _reduce_scatter(self, bucket: _Bucket) -> None:
        """Chunk q of this rank's gradients to rank q; chunk r of every rank arrives here, in rank order."""
        mine = bucket.chunks[self.rank]
        bucket.work = self._all_to_all(bucket.received, bucket.flat, [mine] * self.world, bucket.chunks)

    def _all_gather(self, bucket: _Bucket, b: int) -> None:
        """Wait for the reduce-scatter, sum in rank order, and send the summed chunk to every rank."""
        wait_work(bucket.work, f"gradient reduce-scatter (bucket {b})", self.stats, self.kind)
        mine = bucket.chunks[self.rank]
        rows = bucket.received.view(self.world, mine)  # (K, c_r)
        total = tree_sum(rows.unbind(0))  # fixed order (the pairwise tree over ranks): the V-tree of ``logical``
        bucket.work = self._all_to_all(bucket.flat, total.repeat(self.world), bucket.chunks, [mine] * self.world)

    # ------------------------------------------------------------------------------------------ step
    def wait(self) -> None:
        """Finish every bucket (parameters that got no gradient count as zero) and write the sums into .grad."""
        if self.group is None:
            return
        self.launched_in_backward, self._hook_launches = self._hook_launches, 0
        for bucket in self.buckets[self._next_launch :]:
            for i, p in enumerate(bucket.params):  # unused parameters: contribute zeros
                if i not in bucket.seen:
                    bucket.flat[bucket.offsets[i] : bucket.offsets[i] + p.numel()].zero_()
            self._reduce_scatter(bucket)
        for b, bucket in enumerate(self.buckets):
            self._all_gather(bucket, b)
        for b, bucket in enumerate(self.buckets):
            wait_work(bucket.work, f"gradient all-gather (bucket {b})", self.stats, self.kind)
            for p, off in zip(bucket.params, bucket.offsets):
                g = bucket.flat[off : off + p.numel()].view_as(p)
                if p.grad is None:
                    p.grad = g.clone()
                else:
                    p.grad.copy_(g)
            bucket.ready, bucket.work = 0, None
            bucket.seen.clear()
        self._next_launch = 0

    @property
    def bucket_sizes(self) -> list[int]:
        """Elements in each bucket, in launch order."""
        return [b.flat.numel() for b in self.buckets]

    def remove(self) -> None:
        """Detach the hooks (the model is then free of this sync)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
