"""GreedyProposer: the cheapest option per table first, then re-shard what sits on the slowest rank.

::

    start     each table's cheapest option by total cost that fits in memory (Poseidon's per-layer choice of
              the cheaper scheme: replicate and all-reduce, or shard and all-to-all); replicas, which cost
              memory on every rank, by savings per byte while the memory estimate allows; if the estimate is
              over the budget and tables may be cached, tables move to (smaller) caches, fewest seconds added
              per byte freed first, until it fits
    feasible? if the partitioner says table t fits nowhere: give t smaller shards, else cut the table with the
              largest shards finer or drop the largest replica, whichever frees more
    improve   slowest rank r of the best placement so far: for its costliest model-parallel tables, propose the
              cheapest options that load one rank less (table-wise -> column- or row-wise -> data-parallel);
              the first that rates better becomes the best, and the neighbourhood is rebuilt around it
    stop      no neighbour is better, or ``max_proposals`` used

Rating is the per-rank cost sorted slowest first, compared in order, so that lowering one of two equally slow
ranks counts as progress.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from haloflow.errors import ConfigError, PlanError
from haloflow.partition.planner.types import OptionSet, Placement, Proposer, ShardingType

__all__ = ["GreedyProposer"]


@dataclass(kw_only=True)
class GreedyProposer(Proposer):
    """Args:
    max_proposals: proposals at most (each costs one partition: ~ms per 1,000 shards).
    tables_per_step: costliest tables on the slowest rank to re-shard per neighbourhood.
    options_per_table: alternatives tried for each of them.
    memory_slack: share of the smallest budget the first proposal may plan to fill (in (0, 1]).
    plateau_tolerance: loads within this relative difference count as equal when the search compares
        placements, so that it may cut one of two equally slow ranks' tables even though the cut adds a little
        client cost to every rank (the planner still returns the strictly best placement it saw).
    """

    max_proposals: int = 48
    tables_per_step: int = 6
    options_per_table: int = 2
    memory_slack: float = 0.95  # replicas may fill this share of the smallest budget, leaving room to pack
    plateau_tolerance: float = 0.005  # splitting a table adds a little to every rank; see the class docstring
    _options: OptionSet | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        for key in ("max_proposals", "tables_per_step", "options_per_table"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} must be >= 1, got {getattr(self, key)}")
        if not 0 <= self.plateau_tolerance < 1:
            raise ConfigError(f"plateau_tolerance must be in [0, 1), got {self.plateau_tolerance}")
        if not 0 < self.memory_slack <= 1:
            raise ConfigError(f"memory_slack must be in (0, 1], got {self.memory_slack}")

    def load(self, options: OptionSet) -> None:
        self._options = options
        self._queue = [self._start(options)]
        # If even the most compact option of every table overflows the total budget, nothing can help.
        need = sum(min(float(o.shard_memory.sum()) for o in opts) for opts in options.options)
        self._hopeless = need > sum(options.topology.memory_per_rank)
        self._current: np.ndarray | None = None
        self._best: Placement | None = None
        self._used = 0

    def _start(self, options: OptionSet) -> np.ndarray:
        """Cheapest option per table, replicating a table only while the replicas still leave room.

        Replicas cost memory on every rank, so they are chosen like a knapsack: tables where replication
        saves the most seconds per extra byte first, while the estimated per-rank memory (replicas plus an
        even share of the shards) stays within ``memory_slack`` of the smallest budget.
        """
        k = options.topology.world_size
        budget = options.topology.memory_per_rank
        cap = self.memory_slack * min(budget)
        choice, used = [], 0.0
        self._sharded: list[int | None] = []  # each table's cheapest model-parallel option that fits
        self._density = np.full(len(options.options), np.inf)  # seconds saved per extra byte by replicating
        candidates = []
        for t, opts in enumerate(options.options):  # each cheapest first
            mp = next((i for i, o in enumerate(opts) if not o.fixed_ranks and o.max_memory <= max(budget)), None)
            dp = next((i for i, o in enumerate(opts) if o.fixed_ranks and o.max_memory <= min(budget)), None)
            self._sharded.append(mp)
            if mp is None and dp is None:  # nothing fits: the most compact, for the partitioner to explain
                choice.append(int(np.argmin([o.max_memory for o in opts])))
            elif mp is None or dp is None:
                choice.append(mp if dp is None else dp)
            else:
                choice.append(mp)
                saving = opts[mp].total_cost - opts[dp].total_cost
                extra = opts[dp].max_memory - float(opts[mp].shard_memory.sum()) / k
                if saving > 0:
                    self._density[t] = saving / max(extra, 1e-300)
                    candidates.append((t, dp, extra))
            o = opts[choice[-1]]
            used += o.max_memory if o.fixed_ranks else float(o.shard_memory.sum()) / k
        for t, dp, extra in sorted(candidates, key=lambda c: -self._density[c[0]]):
            if used + extra <= cap:
                choice[t] = dp
                used += extra
        return _fit_caches(options, np.array(choice, np.int64), used, cap)

    def propose(self) -> np.ndarray | None:
        if not self._queue or self._used >= self.max_proposals:
            return None
        self._used += 1
        self._current = self._queue.pop(0)
        return self._current.copy()

    def feedback(self, placement: Placement | None, failure: PlanError | None = None) -> None:
        if placement is None:
            t = getattr(failure, "table_index", None)
            if self._best is None and t is not None and not self._hopeless:  # not feasible yet: free memory
                fix = self._free_memory(self._current, t)
                self._queue = [] if fix is None else [_with(self._current, *fix)]
            return
        if self._best is None or placement.better_than(self._best, rtol=self.plateau_tolerance):
            self._best = placement
            self._queue = self._neighbours(placement)

    def _free_memory(self, choice: np.ndarray, t: int) -> tuple[int, int] | None:
        """(table, option) that makes room after table t fit nowhere.

        Smaller shards for t if it has them; otherwise whichever frees more: cutting the table with the
        largest shards finer (packing is limited by the largest items) or dropping the replica that holds
        the most memory on every rank.
        """
        opts = self._options.options
        cur = [opts[u][choice[u]] for u in range(len(opts))]
        if not cur[t].fixed_ranks:
            alt = self._smaller(t, choice[t])
            if alt is not None:
                return t, alt
        cut, cut_gain = None, 0.0
        for u in sorted(range(len(opts)), key=lambda u: -cur[u].max_memory):
            alt = None if cur[u].fixed_ranks else self._smaller(u, choice[u])
            if alt is not None:
                cut, cut_gain = (u, alt), cur[u].max_memory - opts[u][alt].max_memory
                break
        drop, drop_gain = None, 0.0
        for u in range(len(opts)):
            if cur[u].fixed_ranks and self._sharded[u] is not None:
                gain = cur[u].max_memory - float(opts[u][self._sharded[u]].shard_memory.sum()) / len(cur[u].rows)
                if drop is None or gain > drop_gain:
                    drop, drop_gain = (u, self._sharded[u]), gain
        if cut is None or (drop is not None and (cur[t].fixed_ranks or drop_gain > cut_gain)):
            return drop
        return cut

    def _smaller(self, t: int, cur: int) -> int | None:
        """Table t's cheapest model-parallel option with smaller shards than option ``cur``."""
        opts = self._options.options[t]
        smaller = [i for i, o in enumerate(opts) if o.max_memory < opts[cur].max_memory and not o.fixed_ranks]
        return smaller[0] if smaller else None

    def _neighbours(self, p: Placement) -> list[np.ndarray]:
        r = int(np.argmax(p.load))
        opts = self._options.options
        on_r = []  # (cost of t's shard on r, t)
        for t, ranks in enumerate(p.ranks):
            o = opts[t][p.choice[t]]
            if not o.fixed_ranks:
                hit = np.flatnonzero(ranks == r)
                if hit.size:
                    on_r.append((float(o.shard_cost[hit].sum()) + o.base_cost, t))
        on_r.sort(reverse=True)
        out = []
        for _, t in on_r[: self.tables_per_step]:
            peak = opts[t][p.choice[t]].peak_cost
            lighter = [i for i, o in enumerate(opts[t]) if o.peak_cost < peak]  # cheapest total first
            out += [_with(p.choice, t, i) for i in lighter[: self.options_per_table]]
        return out


def _fit_caches(options: OptionSet, choice: np.ndarray, used: float, cap: float) -> np.ndarray:
    """While the estimated per-rank memory ``used`` exceeds ``cap``, move the table whose move to a (smaller)
    cached option adds the fewest seconds per byte freed; nothing changes for tables without cached options.

    One heap entry per table, its best move from its current option; only the moved table's entry is redone,
    so a step costs O(options of one table + log T).
    """
    k = options.topology.world_size
    opts = options.options

    def share(o) -> float:  # per-rank bytes: a replica on every rank, shards spread evenly
        return o.max_memory if o.fixed_ranks else float(o.shard_memory.sum()) / k

    def best_move(t: int):
        cur = opts[t][choice[t]]
        moves = [((o.total_cost - cur.total_cost) / (share(cur) - share(o)), i, share(cur) - share(o))
                 for i, o in enumerate(opts[t]) if o.sharding is ShardingType.CACHED and share(o) < share(cur)]
        return min(moves) if moves else None

    heap = []
    for t in range(len(opts)):
        if used > cap and (m := best_move(t)) is not None:
            heapq.heappush(heap, (m[0], t, m[1], m[2]))
    while used > cap and heap:
        _, t, i, freed = heapq.heappop(heap)
        choice[t] = i
        used -= freed
        if (m := best_move(t)) is not None:
            heapq.heappush(heap, (m[0], t, m[1], m[2]))
    return choice


def _with(choice: np.ndarray, t: int, i: int) -> np.ndarray:
    out = choice.copy()
    out[t] = i
    return out
