"""haloflow.cache: a software cache for hot embedding rows, exact whatever its size.

::

    RowStore (types.py)            gather(ids) -> rows, apply_gradients(ids, grads), flush, state_dict, close
      MemoryStore (memory.py)      the whole table on the device: the uncached oracle
      CachedStore (cache.py)       S slots on the device over a BackingStore (backing.py): host memory or a
                                   memory-mapped folder; SlotDirectory (directory.py) decides, RowMover
                                   (transfer.py) prefetches in the background
    RowOptimizer (optim.py)        SGD, Adagrad, RowWiseAdagrad: state stored and moved with the rows
    CachePolicy (policy.py)        LRU, LFU, frequency (Colossal-AI), lookahead (lookahead.py: Belady within the
                                   next W batches, announced by the driver); belady.py the optimum; mrc.py curves
    CachedEmbeddingBag             sum-pooled bags over any RowStore, optimizer fused into step()

    store = CachedStore.from_config(BackingStore.create("emb/t2", N, 16, Adagrad(lr=0.01)),
                                    CacheConfig(ratio=0.01, policy="lru"), device="cuda")
    bag = CachedEmbeddingBag(store)
    loss = model(bag(ids, offsets)); loss.backward(); bag.step()
"""

from haloflow.cache.backing import BackingStore, uniform_rows
from haloflow.cache.belady import belady_hits
from haloflow.cache.cache import CacheConfig, CachedStore
from haloflow.cache.directory import BatchPlan, SlotDirectory
from haloflow.cache.embedding_bag import CachedEmbeddingBag
from haloflow.cache.lookahead import LookaheadPolicy
from haloflow.cache.memory import MemoryStore
from haloflow.cache.mrc import MRCPoint, miss_ratio_curve, simulate, smallest_cache_for
from haloflow.cache.optim import SGD, Adagrad, RowWiseAdagrad, make_optimizer
from haloflow.cache.policy import POLICIES, FrequencyPolicy, LFUPolicy, LRUPolicy, make_policy
from haloflow.cache.types import CachePolicy, CacheStats, RowOptimizer, RowStore

__all__ = [
    "RowStore",
    "RowOptimizer",
    "CachePolicy",
    "CacheStats",
    "MemoryStore",
    "BackingStore",
    "uniform_rows",
    "CachedStore",
    "CacheConfig",
    "SlotDirectory",
    "BatchPlan",
    "CachedEmbeddingBag",
    "SGD",
    "Adagrad",
    "RowWiseAdagrad",
    "make_optimizer",
    "LRUPolicy",
    "LFUPolicy",
    "FrequencyPolicy",
    "LookaheadPolicy",
    "make_policy",
    "POLICIES",
    "belady_hits",
    "simulate",
    "miss_ratio_curve",
    "MRCPoint",
    "smallest_cache_for",
]
