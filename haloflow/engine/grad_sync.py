"""Weight-gradient synchronisation in buckets, launched while backward is still running.

Every rank holds a full copy of the (small) GCN weights; each computes the gradient of its share of the loss
(already divided by the *global* number of training nodes), so the true gradient is the plain sum over ranks.

Buckets follow the reverse order of ``parameters()`` (the order backward produces them)::

    params   p0 p1 p2 p3 p4 p5          (forward order)
    buckets  [p5 p4] [p3 p2 p1] [p0]     each at most ``bucket_bytes`` (a lone large parameter gets its own)
    flat     bucket b: (n_b,) float       a parameter's gradient is copied in when its hook fires

    hook(p) -> copy p.grad into its bucket; when the bucket is full, launch an async all_gather
               (buckets launch strictly in index order, so every rank issues the same collectives in the same order)
    wait()  -> wait each gather, sum the K rows in rank order 0, 1, ..., K-1, write back into p.grad

Summing gathered rows in a fixed order (instead of a backend all-reduce whose order the backend chooses) makes
the result bit-identical on every rank and from run to run. Cost per step: K x (sum of parameter sizes) floats
received per rank, which is small for GCN weights.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from haloflow.engine.halo import CommStats, wait_work
from haloflow.errors import ConfigError

__all__ = ["GradSyncConfig", "BucketedGradSync"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class GradSyncConfig:
    """Args:
        bucket_bytes: largest bucket; 1 MiB keeps a few buckets for GCN-sized weights, so the first can fly
            while backward computes the rest (DDP's 25 MiB default would put all of GCN in one bucket).
    """

    bucket_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if self.bucket_bytes <= 0:
            raise ConfigError(f"bucket_bytes must be > 0, got {self.bucket_bytes}")


@dataclass(eq=False)
class _Bucket:
    params: list[nn.Parameter]
    offsets: list[int]  # start of each parameter in ``flat``
    flat: torch.Tensor  # (n,)
    gathered: torch.Tensor  # (K, n)
    ready: int = 0
    work: object | None = None
    launched: bool = False
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
    With ``group=None`` (single process) it does nothing.
    """

    def __init__(self, params, group=None, config: GradSyncConfig | None = None, stats: CommStats | None = None):
        self.config = config or GradSyncConfig()
        self.group = group
        self.stats = stats
        self.params = [p for p in params if p.requires_grad]
        self.world = dist.get_world_size(group) if group is not None else 1
        self.buckets: list[_Bucket] = []
        self._bucket_of: dict[int, tuple[int, int]] = {}  # id(param) -> (bucket index, position)
        self._next_launch = 0
        self._handles = []
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
        groups: list[list[nn.Parameter]] = []
        size = 0
        for p in reversed(self.params):
            nbytes = p.numel() * p.element_size()
            if not groups or size + nbytes > self.config.bucket_bytes:
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
            flat = torch.zeros(n, dtype=dtype, device=device)
            gathered = torch.empty(self.world, n, dtype=dtype, device=device)
            self.buckets.append(_Bucket(plist, offsets, flat, gathered))
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
        self._launch_ready()

    def _launch_ready(self) -> None:
        while self._next_launch < len(self.buckets):
            bucket = self.buckets[self._next_launch]
            if bucket.ready < len(bucket.params):
                return
            self._launch(bucket)
            self._next_launch += 1

    def _launch(self, bucket: _Bucket) -> None:
        rows = list(bucket.gathered.unbind(0))
        bucket.work = dist.all_gather(rows, bucket.flat, group=self.group, async_op=True)
        bucket.launched = True
        if self.stats is not None:
            self.stats.grad_bytes += bucket.flat.numel() * bucket.flat.element_size() * (self.world - 1)

    # ------------------------------------------------------------------------------------------ step
    def wait(self) -> None:
        """Finish every bucket (parameters that got no gradient count as zero) and write the sums into .grad."""
        if self.group is None:
            return
        for bucket in self.buckets[self._next_launch :]:
            for i, p in enumerate(bucket.params):  # unused parameters: contribute zeros
                if i not in bucket.seen:
                    bucket.flat[bucket.offsets[i] : bucket.offsets[i] + p.numel()].zero_()
            self._launch(bucket)
        self._next_launch = len(self.buckets)
        for b, bucket in enumerate(self.buckets):
            wait_work(bucket.work, f"gradient all-gather (bucket {b})", self.stats, grad=True)
            total = bucket.gathered[0].clone()
            for r in range(1, self.world):  # fixed order: bit-identical on every rank
                total += bucket.gathered[r]
            for p, off in zip(bucket.params, bucket.offsets):
                g = total[off : off + p.numel()].view_as(p)
                if p.grad is None:
                    p.grad = g.clone()
                else:
                    p.grad.copy_(g)
            bucket.ready, bucket.work, bucket.launched = 0, None, False
            bucket.seen.clear()
        self._next_launch = 0

    def remove(self) -> None:
        """Detach the hooks (the model is then free of this sync)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
