"""The steps ``bench contention`` times: haloflow's GCN, DLRM and TGN training steps and their plain-PyTorch peers.

Each builder returns a function that trains one step (the next batch; GCN: one full-batch epoch) on the same
math for both sides; the peers are the ones the one-family benches use::

    family   haloflow (and "fixed": the same with --fixed-threads)      peer
    gcn      GCNFamily.train_step (Kipf, no precompute)  2 x PyG GCNConv(cached) on a sparse CSR adjacency
    dlrm     DLRMFamily.train_unit (synthetic clicks)    PlainDLRM: nn.EmbeddingBag per table + the same MLPs
    tgn      TGNFamily.train_unit                        PyG's TGN example (PygTGN), the same negatives

Dropout is 0 and weight decay 0 in GCN so that both sides compute exactly Kipf's model with Adam; DLRM's batches
are drawn ahead on both sides (the peer's also sliced per table), as a data loader would hand them over; the TGN
peer's negatives are haloflow's (drawn ahead; haloflow's step draws its own). ``SIZES`` holds the shapes: ``small`` gives steps of a few to a few tens of ms on 2 cores,
``tiny`` is for tests.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from haloflow.engine.runtime import Runtime, RuntimeConfig
from haloflow.engine.trainer import Family

__all__ = ["Sizes", "SIZES", "FAMILIES", "build_step"]

FAMILIES = ("gcn", "dlrm", "tgn")
Step = Callable[[], None]


@dataclass(frozen=True)
class Sizes:
    gcn_nodes: int
    gcn_entries: int  # adjacency entries, both directions
    gcn_dims: tuple[int, int, int]  # in, hidden, classes
    dlrm_scale: float  # Kaggle table sizes times this
    dlrm_batch: int
    dlrm_mlps: tuple[tuple[int, ...], tuple[int, ...]]  # bottom, top hidden widths
    tgn_events: int
    tgn_nodes: tuple[int, int]  # users, items
    tgn_batch: int
    tgn_dim: int  # memory = time = embedding width


SIZES = {
    "small": Sizes(gcn_nodes=20_000, gcn_entries=200_000, gcn_dims=(64, 64, 16), dlrm_scale=1e-3, dlrm_batch=128,
                   dlrm_mlps=((512, 256, 64), (512, 256)), tgn_events=12_000, tgn_nodes=(1_000, 200), tgn_batch=200,
                   tgn_dim=100),
    "tiny": Sizes(gcn_nodes=400, gcn_entries=3_000, gcn_dims=(8, 8, 4), dlrm_scale=1e-5, dlrm_batch=16,
                  dlrm_mlps=((16,), (16,)), tgn_events=1_200, tgn_nodes=(60, 20), tgn_batch=50, tgn_dim=8),
}


def build_step(family: str, side: str, sizes: Sizes, seed: int = 0) -> Step:
    """The step function of ``family`` ("gcn", "dlrm", "tgn") for ``side``: "haloflow" (the runtime's thread
    governor looks after each step, as the training loop has it do), "fixed" (``--fixed-threads``) or "peer"."""
    if side == "peer":
        return _PEERS[family](sizes, seed)
    runtime = RuntimeConfig(device="cpu", progress=False, adapt_threads=side != "fixed")
    step, rt, fam = _HALOFLOW[family](sizes, seed, runtime)
    adapts = fam.adapts_threads  # as the training loop (engine/trainer.run): GCN keeps its threads

    def unit():
        step()
        if adapts:
            rt.between_units()

    return unit


# ------------------------------------------------------------------------------------------------ GCN
def _graph(sizes: Sizes, seed: int):
    from haloflow.bench.gcn import random_graph

    rng = np.random.default_rng(seed)
    graph = random_graph(sizes.gcn_nodes, sizes.gcn_entries, seed)
    x = rng.standard_normal((sizes.gcn_nodes, sizes.gcn_dims[0]), dtype=np.float32)  # (N, in)
    y = rng.integers(0, sizes.gcn_dims[2], sizes.gcn_nodes)  # (N,)
    return graph, x, y


def _gcn_haloflow(sizes: Sizes, seed: int, runtime: RuntimeConfig) -> tuple[Step, Runtime, Family]:
    from haloflow.data.graph import GraphDataset
    from haloflow.engine.gcn.train import GCNFamily, GCNTrainConfig

    graph, x, y = _graph(sizes, seed)
    data = GraphDataset(graph, features=x, labels=y, train_mask=np.ones(graph.num_nodes, bool),
                        num_classes=sizes.gcn_dims[2])
    config = GCNTrainConfig(dataset="-", hidden_dim=sizes.gcn_dims[1], dropout=0.0, precompute_first=False,
                            weight_decay=0.0, normalize_features=False, seed=seed, runtime=runtime)
    family, rt = GCNFamily(config, dataset=data), Runtime.start(runtime, join=False)
    family.setup(rt)
    family.begin(0)
    epoch = iter(range(10**9))
    return (lambda: family.train_step(next(epoch))), rt, family


def _gcn_peer(sizes: Sizes, seed: int) -> Step:
    from haloflow.bench.gcn import PygGCN

    graph, x, y = _graph(sizes, seed)
    n = graph.num_nodes
    adj_t = torch.sparse_csr_tensor(torch.from_numpy(graph.indptr), torch.from_numpy(graph.indices),
                                    torch.ones(graph.num_edges), size=(n, n), check_invariants=False)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    torch.manual_seed(seed)
    model = PygGCN(list(sizes.gcn_dims), 0.0).train()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x, adj_t), y).backward()
        opt.step()

    return step


# ------------------------------------------------------------------------------------------------ DLRM
def _dlrm_haloflow(sizes: Sizes, seed: int, runtime: RuntimeConfig) -> tuple[Step, Runtime, Family]:
    from haloflow.data.clicks import CHUNK
    from haloflow.engine.dlrm.train import DLRMFamily, DLRMTrainConfig

    bottom, top = sizes.dlrm_mlps
    config = DLRMTrainConfig(synthetic=True, synthetic_scale=sizes.dlrm_scale, batch_size=sizes.dlrm_batch,
                             bottom_mlp=bottom, top_mlp=top, seed=seed, max_steps=10**9, runtime=runtime)
    family, rt = DLRMFamily(config), Runtime.start(runtime)
    family.setup(rt)
    family.begin(0)
    # the batches drawn ahead, as the peer's are: the generator draws a chunk of many batches at a time, a spike
    # in one step in CHUNK / B that is the data's cost, not the step's
    family.stream = itertools.cycle(list(itertools.islice(family.stream, max(1, CHUNK // sizes.dlrm_batch))))
    index = iter(range(10**9))
    return (lambda: family.train_unit(next(index))), rt, family


def _dlrm_peer(sizes: Sizes, seed: int) -> Step:
    from haloflow.bench.dlrm import PlainDLRM, plain_inputs
    from haloflow.data.clicks import CHUNK, ClickLogConfig, ClickLogGenerator

    gen = ClickLogGenerator(ClickLogConfig(scale=sizes.dlrm_scale, seed=seed))
    bottom, top = sizes.dlrm_mlps
    model = PlainDLRM(gen.sizes, num_dense=gen.config.num_dense, bottom=bottom, top=top)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [(b, plain_inputs(b.sparse)) for b in gen.batches(sizes.dlrm_batch, max(1, CHUNK // sizes.dlrm_batch))]
    index = iter(range(10**9))

    def step():
        b, (ids, offsets) = batches[next(index) % len(batches)]
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.binary_cross_entropy_with_logits(model(b.dense, ids, offsets), b.labels).backward()
        opt.step()

    return step


# ------------------------------------------------------------------------------------------------ TGN
def _stream(sizes: Sizes, seed: int):
    """A bipartite user -> item stream with repeat visits (memory matters), times ascending, 16 edge features."""
    from haloflow.data.temporal import TemporalEvents

    rng = np.random.default_rng(seed)
    users, items = sizes.tgn_nodes
    e = sizes.tgn_events
    src = rng.integers(0, users, e)
    dst = users + np.minimum(rng.zipf(1.5, e) - 1 + (src % 7) * 5, items - 1)
    return TemporalEvents(src=src, dst=dst, t=np.cumsum(rng.integers(0, 5, e)), num_nodes=users + items,
                          edge_feat=rng.standard_normal((e, 16)).astype(np.float32))


def _tgn_config(sizes: Sizes, seed: int, runtime: RuntimeConfig | None = None):
    from haloflow.engine.tgn.train import TGNTrainConfig

    d = sizes.tgn_dim
    return TGNTrainConfig(events="-", batch_size=sizes.tgn_batch, memory_dim=d, time_dim=d, embedding_dim=d,
                          epochs=10**6, seed=seed, eval=False,
                          runtime=runtime or RuntimeConfig(device="cpu", progress=False))


def _tgn_haloflow(sizes: Sizes, seed: int, runtime: RuntimeConfig) -> tuple[Step, Runtime, Family]:
    from haloflow.engine.tgn.train import TGNFamily

    config = _tgn_config(sizes, seed, runtime)
    family, rt = TGNFamily(config, events=_stream(sizes, seed)), Runtime.start(runtime)
    family.setup(rt)
    family.begin(0)
    index = iter(range(10**9))
    return (lambda: family.train_unit(next(index))), rt, family


def _tgn_peer(sizes: Sizes, seed: int) -> Step:
    from haloflow.bench.tgn import PygTGN
    from haloflow.data.temporal import chronological_split, inductive_nodes
    from haloflow.data.temporal_sampler import NegativeSampler

    config, events = _tgn_config(sizes, seed), _stream(sizes, seed)
    train_ids = inductive_nodes(events, chronological_split(events), config.inductive_fraction, seed=seed).train_ids
    neg = NegativeSampler.from_destinations(events, train_ids, seed=seed).sample(train_ids, stream=0)  # haloflow's
    B = config.batch_size
    batches = [(train_ids[i:i + B], neg[i:i + B]) for i in range(0, train_ids.shape[0], B)]
    model = PygTGN(events, seed, dim=sizes.tgn_dim, neighbors=config.num_neighbors)
    model.train()
    index = iter(range(10**9))

    def step():
        i = next(index) % len(batches)
        if i == 0:
            model.reset()  # a new epoch starts from an empty memory, as haloflow's does
        model.batch(*batches[i], train=True)

    return step


_HALOFLOW = {"gcn": _gcn_haloflow, "dlrm": _dlrm_haloflow, "tgn": _tgn_haloflow}
_PEERS = {"gcn": _gcn_peer, "dlrm": _dlrm_peer, "tgn": _tgn_peer}
