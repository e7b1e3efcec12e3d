"""GreedyCostPartitioner: each shard to the least-loaded rank it fits on, then moves and swaps off the slowest rank.

::

    replicas (data-parallel)  -> every rank, fixed; their memory comes off every budget first
    shards, costliest first   -> rank with the lowest load that has the memory and no other shard of the table
                                 (if one fits nowhere: again, largest memory first, to the rank with most free
                                 memory; if still nowhere: PlanError saying how much is missing where)
    improve                   -> while some move or swap of a shard on the slowest rank r lowers r's load
                                 without lifting the other rank to it, apply the best one

Greedy in cost order is LPT scheduling (within 4/3 of optimal for identical items); the improvement steps
close most of the rest. A step costs O(n_r * n_q) array work for the shards n_r, n_q on the two ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from haloflow.errors import ConfigError, PlanError
from haloflow.partition.planner.cost_model import gib
from haloflow.partition.planner.types import OptionSet, Partitioner, Placement

__all__ = ["GreedyCostPartitioner"]

_TOL = 1e-12  # relative: a step must lower the slowest rank by more than rounding


@dataclass(frozen=True, kw_only=True)
class GreedyCostPartitioner(Partitioner):
    """Args:
    improve: run the move/swap improvement after the greedy placement.
    max_steps: improvement steps at most (each lowers the sorted per-rank loads, so it also ends on its own).
    """

    improve: bool = True
    max_steps: int = 200

    def __post_init__(self) -> None:
        if self.max_steps < 0:
            raise ConfigError(f"max_steps must be >= 0, got {self.max_steps}")

    def partition(self, options: OptionSet, choice: np.ndarray) -> Placement:
        k = options.topology.world_size
        budget = np.array(options.topology.memory_per_rank)  # (K,)
        chosen = [options.options[t][int(c)] for t, c in enumerate(choice)]
        load = np.full(k, sum(o.base_cost for o in chosen))  # (K,) every rank pays every table's base
        mem = np.zeros(k)  # (K,)
        ranks: list[np.ndarray | None] = [None] * len(chosen)
        replicas = [t for t, o in enumerate(chosen) if o.fixed_ranks]
        for t in replicas:
            ranks[t] = np.arange(k)
        if replicas:  # one replica per rank, shard s on rank s
            rep_mem = np.array([chosen[t].shard_memory for t in replicas])  # (T_dp, K)
            load += np.array([chosen[t].shard_cost for t in replicas]).sum(axis=0)
            used = np.cumsum(rep_mem, axis=0)  # (T_dp, K) memory after each replica
            over = np.flatnonzero((used > budget[None, :]).any(axis=1))
            if over.size:
                i = int(over[0])
                raise _unplaceable(options, replicas[i], rep_mem[i, 0], budget - used[i] + rep_mem[i],
                                   "a data-parallel replica on every rank")
            mem += used[-1]
        # Items: every shard to place, as parallel arrays (N,).
        free = [(t, o) for t, o in enumerate(chosen) if not o.fixed_ranks]
        counts = np.array([o.num_shards for _, o in free], np.int64)
        tab = np.repeat(np.array([t for t, _ in free], np.int64), counts)
        sid = np.arange(tab.size) - np.repeat(np.cumsum(counts) - counts, counts)
        cost = np.concatenate([o.shard_cost for _, o in free]) if free else np.zeros(0)
        size = np.concatenate([o.shard_memory for _, o in free]) if free else np.zeros(0)
        placed = _greedy(np.lexsort((-size, -cost)), cost, size, tab, load, mem, budget, by_load=True)
        if isinstance(placed, _Stuck):  # memory is tight: biggest first, each to the emptiest rank
            placed = _greedy(np.lexsort((-cost, -size)), cost, size, tab, load, mem, budget, by_load=False)
        if isinstance(placed, _Stuck):
            t = int(tab[placed.item])
            o = chosen[t]
            kind = f"{o.num_shards} {o.sharding.value} shards" if o.num_shards > 1 else "one shard"
            raise _unplaceable(options, t, size[placed.item], placed.free, kind)
        rank_of, load, mem = placed
        if self.improve:
            _improve(rank_of, cost, size, tab, load, mem, budget, self.max_steps)
        for t, o in enumerate(chosen):
            if not o.fixed_ranks:
                ranks[t] = np.empty(o.num_shards, np.int64)
        for i in range(tab.size):
            ranks[tab[i]][sid[i]] = rank_of[i]
        return Placement(choice=np.asarray(choice, np.int64).copy(), ranks=tuple(ranks), load=load, memory=mem)


@dataclass(frozen=True)
class _Stuck:
    """Item ``item`` fit on no rank; ``free`` (K,) bytes left per rank then (-inf where its table already is)."""

    item: int
    free: np.ndarray


def _greedy(order, cost, size, tab, load0, mem0, budget, by_load: bool):
    """Place items in ``order`` on the least-loaded (or, ``by_load=False``, the emptiest) rank that fits.

    Returns (rank per item, load, mem), or ``_Stuck`` for the first item that fits nowhere. Plain Python
    lists in the loop: K is small, and list indexing beats numpy calls on scalars.
    """
    k = load0.size
    load, mem, cap = load0.tolist(), mem0.tolist(), budget.tolist()
    rank_of = np.full(cost.size, -1, np.int64)
    held: dict[int, set[int]] = {}
    for i in order.tolist():
        t, m = int(tab[i]), float(size[i])
        used = held.setdefault(t, set())
        best, key = -1, 0.0
        for r in range(k):
            if mem[r] + m <= cap[r] and r not in used:
                kr = load[r] if by_load else mem[r] - cap[r]
                if best < 0 or kr < key:
                    best, key = r, kr
        if best < 0:
            free = np.array([-np.inf if r in used else cap[r] - mem[r] for r in range(k)])
            return _Stuck(i, free)
        rank_of[i] = best
        used.add(best)
        load[best] += float(cost[i])
        mem[best] += m
    return rank_of, np.array(load), np.array(mem)


def _improve(rank_of, cost, size, tab, load, mem, budget, max_steps: int) -> None:
    """Best move or swap of a shard off the slowest rank, repeated while one helps. Updates arrays in place."""
    k = load.size
    for _ in range(max_steps):
        r = int(np.argmax(load))
        limit = load[r] * (1 - _TOL)
        on_r = np.flatnonzero(rank_of == r)
        if on_r.size == 0:
            return
        holds = _holds(rank_of, tab, k)  # (T_max+1, K) bool: table has a shard on rank
        # Moves: item a from r to q. Shapes: (n_r, K).
        d, m = cost[on_r][:, None], size[on_r][:, None]
        peak = np.maximum(load[r] - d, load[None, :] + d)
        ok = (mem[None, :] + m <= budget[None, :]) & ~holds[tab[on_r]] & (d > 0)
        ok[:, r] = False
        peak = np.where(ok, peak, np.inf)
        a, q = np.unravel_index(np.argmin(peak), peak.shape)
        best, step = peak[a, q], ("move", on_r[a], None, int(q))
        # Swaps, only when no move helps: a on r with b on q. Shapes: (n_r, n_q).
        for q in range(k if not best < limit else 0):
            if q == r:
                continue
            on_q = np.flatnonzero(rank_of == q)
            if on_q.size == 0:
                continue
            delta = cost[on_r][:, None] - cost[on_q][None, :]
            dm = size[on_r][:, None] - size[on_q][None, :]
            ok = (delta > 0) & (mem[r] - dm <= budget[r]) & (mem[q] + dm <= budget[q])
            ok &= ~holds[tab[on_r], q][:, None] & ~holds[tab[on_q], r][None, :]
            ok &= tab[on_r][:, None] != tab[on_q][None, :]
            p = np.where(ok, np.maximum(load[r] - delta, load[q] + delta), np.inf)
            i, j = np.unravel_index(np.argmin(p), p.shape)
            if p[i, j] < best:
                best, step = p[i, j], ("swap", on_r[i], on_q[j], q)
        if not best < limit:
            return
        kind, a, b, q = step
        _shift(rank_of, cost, size, load, mem, a, r, q)
        if kind == "swap":
            _shift(rank_of, cost, size, load, mem, b, q, r)


def _holds(rank_of, tab, k: int) -> np.ndarray:
    out = np.zeros((int(tab.max()) + 1 if tab.size else 1, k), bool)
    out[tab, rank_of] = True
    return out


def _shift(rank_of, cost, size, load, mem, i, src, dst) -> None:
    rank_of[i] = dst
    load[src] -= cost[i]
    load[dst] += cost[i]
    mem[src] -= size[i]
    mem[dst] += size[i]


def _unplaceable(options: OptionSet, t: int, need: float, free: np.ndarray, kind: str) -> PlanError:
    """``table t7 (... = 1.21 GiB) does not fit: largest free budget 0.50 GiB on rank 2; total needed ...``."""
    r = int(np.argmax(free))
    total = sum(min(float(o.shard_memory.sum()) for o in opts) for opts in options.options)
    budget = float(sum(options.topology.memory_per_rank))
    how = "" if kind == "one shard" else f" as {kind} ({gib(need)} each)" if kind.endswith("shards") \
        else f" as {kind}"
    err = PlanError(
        f"table {options.describe(t)} does not fit{how}: largest free budget {gib(max(free[r], 0.0))} on rank {r}; "
        f"total needed {gib(total)} {'>' if total > budget else '<='} total budget {gib(budget)}"
    )
    err.table_index = t
    return err

