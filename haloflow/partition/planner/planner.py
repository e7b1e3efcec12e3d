"""EmbeddingShardingPlanner: the search loop, one stage per line.

::

    topology --reserve--> budgets --enumerate--> costed options per table
        loop: propose (option per table) --partition--> placement --rate--> feedback to the proposer
    best placement --grow caches--> ShardingPlan (shards on ranks, per-rank cost and memory recomputed by the
                                    cost model); cached tables take the largest cache their rank still holds

Each stage is an argument with a default; see ``types.py`` for the interfaces.
"""

from __future__ import annotations

import logging

import numpy as np

from haloflow.errors import PlanError
from haloflow.partition.planner.cost_model import EmbeddingCostModel
from haloflow.partition.planner.enumerators import ShardingOptionEnumerator
from haloflow.partition.planner.partitioners import GreedyCostPartitioner
from haloflow.partition.planner.proposers import GreedyProposer
from haloflow.partition.planner.storage_reservations import FixedFractionReservation
from haloflow.partition.planner.types import (
    CostModel,
    Enumerator,
    OptionSet,
    Partitioner,
    Placement,
    Proposer,
    Shard,
    ShardingPlan,
    ShardingType,
    StorageReservation,
    TablePlan,
    TableSpec,
    Topology,
)
from haloflow.partition.planner.validate import validate_plan

__all__ = ["EmbeddingShardingPlanner", "plan_tables", "lower_bound", "table_wise_plan", "grow_caches"]

log = logging.getLogger(__name__)


class EmbeddingShardingPlanner:
    """Plans the sharding of embedding tables on ``topology`` to minimise the slowest rank's cost in memory.

    Args:
        topology: ranks, memory budgets, bandwidths.
        cost_model: prices the options (default ``EmbeddingCostModel()``: batch size, precision, optimizer state).
        reservation, enumerator, proposer, partitioner: the stages (defaults: no reservation, every option,
            ``GreedyProposer``, ``GreedyCostPartitioner``). An enumerator given here brings its own cost model.
    """

    def __init__(
        self,
        topology: Topology,
        *,
        cost_model: CostModel | None = None,
        reservation: StorageReservation | None = None,
        enumerator: Enumerator | None = None,
        proposer: Proposer | None = None,
        partitioner: Partitioner | None = None,
    ) -> None:
        self.topology = topology
        self.reservation = reservation or FixedFractionReservation()
        self.enumerator = enumerator or ShardingOptionEnumerator(cost_model=cost_model or EmbeddingCostModel())
        self.proposer = proposer or GreedyProposer()
        self.partitioner = partitioner or GreedyCostPartitioner()

    def plan(self, tables: list[TableSpec] | tuple[TableSpec, ...]) -> ShardingPlan:
        tables = tuple(tables)
        usable = self.reservation.reserve(self.topology, tables)
        options = self.enumerator.enumerate(tables, usable)
        self.proposer.load(options)
        best: Placement | None = None
        failure: PlanError | None = None
        while (choice := self.proposer.propose()) is not None:
            try:
                placement = self.partitioner.partition(options, choice)
            except PlanError as err:
                failure = err
                self.proposer.feedback(None, err)
                continue
            if best is None or placement.better_than(best):
                best = placement
            self.proposer.feedback(placement)
        if best is None:
            raise failure or PlanError("the proposer proposed nothing")
        best = grow_caches(options, best)
        log.info("planned %d tables on %d ranks: slowest rank %.3g s", len(tables), usable.world_size,
                 best.max_load)
        return self.to_plan(options, best)

    def to_plan(self, options: OptionSet, placement: Placement) -> ShardingPlan:
        """The placement as a ``ShardingPlan``, rated rank by rank by the cost model."""
        plans = []
        for t, (spec, ranks) in enumerate(zip(options.tables, placement.ranks)):
            o = options.options[t][placement.choice[t]]
            shards = tuple(Shard(int(r), int(ro), int(nr), int(co), int(nc))
                           for r, ro, nr, co, nc in zip(ranks, o.row_offsets, o.rows, o.col_offsets, o.cols))
            plans.append(TablePlan(spec.name, t, o.sharding, shards, o.cache_rows))
        plan = ShardingPlan(options.topology.world_size, tuple(plans))
        validate_plan(plan, options.tables)
        per_rank = options.cost_model.rank_costs(plan, options.tables, self.topology)
        return ShardingPlan(plan.world_size, plan.tables, per_rank)


def grow_caches(options: OptionSet, placement: Placement) -> Placement:
    """Give every cached table the largest cache (or, room permitting, the whole table on the device) that its
    rank's memory still holds, largest table first.

    A cached table's other single-shard options on the same rank (a larger cache, or table-wise) cost that rank
    less and no other rank anything, so each step only lowers a load; the search itself may stop at a smaller
    cache than the budget allows, since it moves whole proposals.
    """
    budget = np.array(options.topology.memory_per_rank)  # (K,)
    choice, ranks = placement.choice.copy(), list(placement.ranks)
    load, memory = placement.load.copy(), placement.memory.copy()
    cached = [t for t in range(choice.size) if options.options[t][choice[t]].sharding is ShardingType.CACHED]
    for t in sorted(cached, key=lambda t: -options.tables[t].num_rows):
        opts, cur = options.options[t], options.options[t][choice[t]]
        r = int(ranks[t][0])
        room = budget[r] - memory[r] + cur.max_memory
        better = [i for i, o in enumerate(opts)
                  if o.sharding in (ShardingType.CACHED, ShardingType.TABLE_WISE) and o.max_memory <= room
                  and o.base_cost == cur.base_cost and o.shard_cost[0] < cur.shard_cost[0]]
        if better:
            i = min(better, key=lambda i: (opts[i].shard_cost[0], opts[i].max_memory))
            load[r] += opts[i].shard_cost[0] - cur.shard_cost[0]
            memory[r] += opts[i].max_memory - cur.max_memory
            choice[t] = i
    return Placement(choice=choice, ranks=tuple(ranks), load=load, memory=memory)


def plan_tables(tables, topology: Topology, **stages) -> ShardingPlan:
    """``EmbeddingShardingPlanner(topology, **stages).plan(tables)``."""
    return EmbeddingShardingPlanner(topology, **stages).plan(tables)


def lower_bound(options: OptionSet) -> float:
    """No plan's slowest rank costs less than this (seconds).

    The larger of: the cheapest total cost / K, and the largest cost one table must put on a single rank.
    The cheapest total respects memory as a fractional knapsack: replicating table t saves seconds but takes
    (K-1) more copies of its bytes, and all copies must fit in the sum of the budgets.
    """
    k = options.topology.world_size
    budgets = options.topology.memory_per_rank
    total, peak, room, gains = 0.0, 0.0, float(sum(budgets)), []
    for opts in options.options:
        fit = [o for o in opts if o.max_memory <= (min(budgets) if o.fixed_ranks else max(budgets))] or list(opts)
        peak = max(peak, min(o.peak_cost for o in fit))
        sharded = [o for o in fit if not o.fixed_ranks]
        replica = min((o.total_cost for o in fit if o.fixed_ranks), default=np.inf)
        if not sharded:  # replicas only
            total += replica
            room -= k * fit[0].max_memory
            continue
        best = min(o.total_cost for o in sharded)
        size = float(min(o.shard_memory.sum() for o in sharded))
        total += best
        room -= size
        if replica < best:
            gains.append((best - replica, (k - 1) * size))
    for gain, extra in sorted(gains, key=lambda g: -g[0] / max(g[1], 1e-300)):  # fractional knapsack
        take = 1.0 if extra <= room else max(room, 0.0) / extra
        total -= take * gain
        room -= take * extra
        if take < 1.0:
            break
    return max(total / k, peak)


def table_wise_plan(table_sizes: tuple[int, ...] | list[int], dim: int, world_size: int) -> ShardingPlan:
    """Whole tables on ranks, largest first to the rank with the fewest rows (what training uses without a plan).

    Tables are named ``t0, t1, ...`` in order. No cost model: a plain, predictable default.
    """
    load = [0] * world_size
    owner = {}
    for t in sorted(range(len(table_sizes)), key=lambda t: -table_sizes[t]):
        r = min(range(world_size), key=lambda r: (load[r], r))
        owner[t] = r
        load[r] += table_sizes[t]
    tables = tuple(TablePlan(f"t{t}", t, ShardingType.TABLE_WISE, (Shard(owner[t], 0, n, 0, dim),))
                   for t, n in enumerate(table_sizes))
    return ShardingPlan(world_size, tables)
