"""What one DLRM training step asks of the device, counted op by op (issue: tables in the GPU's shape).

A ``TorchDispatchMode`` sees every aten op of ``train.train_step`` (forward, backward, the tables' fused update
and the MLPs' optimizer). The step must cost the same ops for 26 tables as for 52 (one lookup and one update
for all of them), at most 150, and run no op whose output size or value the host must read from the device
(on a GPU each is a device-to-host sync that stalls the step). The loss is read back by the trainer once per
``--log-every`` steps, outside the step.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from haloflow.cache import CacheConfig, make_optimizer
from haloflow.data.jagged import ClickBatch, JaggedBatch
from haloflow.engine.dlrm.parallelize import parallelize_dlrm
from haloflow.engine.dlrm.shard_stores import ShardStores
from haloflow.engine.dlrm.train import mlp_optimizer, train_step
from haloflow.models.dlrm import DLRMConfig
from haloflow.partition.planner.planner import table_wise_plan

# ops whose output size or value comes from the data: the host must wait for the device to know it
SYNC_OPS = {"_local_scalar_dense", "nonzero", "_unique2", "unique_dim", "unique_consecutive", "_unique",
            "masked_select", "item"}
MAX_OPS, MAX_SPREAD = 150, 5
B = 64


class OpCounter(TorchDispatchMode):
    """Counts aten ops by name, and records the ones that synchronise with the host."""

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.counts[name] += 1
        if name in SYNC_OPS:
            self.syncs.append(name)
        elif name == "repeat_interleave" and kwargs.get("output_size") is None and len(args) < 4:
            self.syncs.append("repeat_interleave without output_size")
        out = func(*args, **kwargs)
        if name in ("_to_copy", "copy_") and isinstance(out, torch.Tensor):
            srcs = [a for a in args if isinstance(a, torch.Tensor)]
            if out.device.type == "cpu" and any(a.device.type != "cpu" for a in srcs):
                self.syncs.append(f"{name} to the host")
        return out

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _batch(num_tables: int, sizes: tuple[int, ...], step: int) -> ClickBatch:
    g = torch.Generator().manual_seed(step)
    lengths = torch.randint(0, 3, (num_tables, B), generator=g)
    values = torch.cat([torch.randint(0, n, (int(lengths[t].sum()),), generator=g) for t, n in enumerate(sizes)])
    return ClickBatch(torch.rand(B, 13, generator=g), JaggedBatch(lengths, values),
                      torch.randint(0, 2, (B,), generator=g).float())


def _count_step(num_tables: int, optimizer: str, read_loss: bool = False, cache: str | None = None) -> OpCounter:
    """Ops of the third step (the first two warm up) of a one-process DLRM with ``num_tables`` tables; with a
    ``cache`` policy, 30 % of the rows cached, and the step plans and moves the next batch's rows (prefetch). A
    lookahead cache is told each batch as the trainer reads it, two ahead: the count includes telling it one."""
    sizes = tuple(40 + 3 * t for t in range(num_tables))
    config = DLRMConfig(table_sizes=sizes, bottom_mlp=(32, 16), top_mlp=(32,))
    histograms = tuple(np.arange(n, dtype=np.int64) % 7 for n in sizes) if cache == "frequency" else None
    stores = ShardStores(optimizer=make_optimizer({"name": optimizer, "lr": 0.05}), histograms=histograms,
                         cache=CacheConfig(ratio=0.3, policy=cache, window=2) if cache else None)
    net = parallelize_dlrm(config, table_wise_plan(sizes, 16, 1), None, stores=stores)
    net.embeddings.check_ids = False  # as the trainer: checked on the host
    assert net.embeddings.can_prefetch == (cache is not None)
    opt = mlp_optimizer(net, optimizer, 0.05)
    batches = [_batch(num_tables, sizes, step) for step in range(6)]
    for b in batches[:3]:  # as the trainer reads them: the step's batch, the next, and the window (2) after it
        net.embeddings.announce(b.sparse)  # a no-op but for lookahead
    for step in range(2):
        net.embeddings.announce(batches[step + 3].sparse)
        train_step(net, opt, batches[step], [B], [B], B, upcoming=batches[step + 1] if cache else None)
    counter = OpCounter()
    with counter:
        net.embeddings.announce(batches[5].sparse)
        losses = train_step(net, opt, batches[2], [B], [B], B, upcoming=batches[3] if cache else None)
        if read_loss:
            losses.sum().item()
    return counter


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad"])
@pytest.mark.parametrize("cache", [None, "lru", "lfu", "frequency", "lookahead"])
def test_a_step_costs_the_same_ops_for_26_and_52_tables_and_reads_nothing_back(optimizer, cache):
    c26, c52 = _count_step(26, optimizer, cache=cache), _count_step(52, optimizer, cache=cache)
    assert c26.syncs == [] and c52.syncs == [], (c26.syncs, c52.syncs)
    assert abs(c26.total - c52.total) <= MAX_SPREAD, (c26.total, c52.total, c52.counts - c26.counts)
    assert max(c26.total, c52.total) <= MAX_OPS, c52.counts.most_common(20)
    bags = {k: n for k, n in c26.counts.items() if k.startswith("_embedding_bag") and "backward" not in k}
    assert sum(bags.values()) == 1, bags  # one lookup for all tables


def test_the_counter_catches_a_loss_read_back():
    """Control: an ``.item()`` on the loss inside the counted region is seen."""
    counter = _count_step(26, "sgd", read_loss=True)
    assert counter.syncs == ["_local_scalar_dense"]


@pytest.mark.parametrize("cache", ["lru", "lookahead"])
def test_announce_through_tells_a_lookahead_cache_window_plus_one_ahead(cache):
    """``announce_through`` as the trainer's read-ahead: before the step on batch i, batches up to i + W + 1 (here
    W = 2) are announced once each; without a lookahead cache nothing is."""
    sizes = (40, 43, 46)
    config = DLRMConfig(table_sizes=sizes, bottom_mlp=(32, 16), top_mlp=(32,))
    stores = ShardStores(optimizer=make_optimizer({"name": "sgd", "lr": 0.05}),
                         cache=CacheConfig(ratio=0.3, policy=cache, window=2))
    net = parallelize_dlrm(config, table_wise_plan(sizes, 16, 1), None, stores=stores)
    batches = [_batch(3, sizes, step) for step in range(7)]
    sparse = [b.sparse for b in batches]
    emb, opt, told = net.embeddings, mlp_optimizer(net, "sgd", 0.05), 0
    for i in range(6):
        told = emb.announce_through(sparse, told, i)
        assert told == (min(i + 4, 7) if cache == "lookahead" else 0)
        assert emb.announce_through(sparse, told, i) == told  # nothing new before the same step
        train_step(net, opt, batches[i], [B], [B], B)
    assert emb.planned_ahead()["announced"] == (6 if cache == "lookahead" else 0)
