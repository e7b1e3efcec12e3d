"""EmbeddingShardingPlanner: the search loop, one stage per line.

::

    topology --reserve--> budgets --enumerate--> costed options per table
        loop: propose (option per table) --partition--> placement --rate--> feedback to the proposer
    best placement --> ShardingPlan (shards on ranks, per-rank cost and memory recomputed by the cost model)

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
    Enumerator,
    OptionSet,
    Partitioner,
    Placement,
    Proposer,
    Shard,
    ShardingPlan,
    StorageReservation,
    TablePlan,
    TableSpec,
    Topology,
)

__all__ = ["EmbeddingShardingPlanner", "plan_tables"]

log = logging.getLogger(__name__)


class EmbeddingShardingPlanner:
    """Plans the sharding of embedding tables on ``topology`` to minimise the slowest rank's cost in memory.

    Args:
        topology: ranks, memory budgets, bandwidths.
        cost_model: batch size, precision, optimizer state (default ``EmbeddingCostModel()``).
        reservation, enumerator, proposer, partitioner: the stages (defaults: no reservation, every option,
            ``GreedyProposer``, ``GreedyCostPartitioner``). An enumerator given here brings its own cost model.
    """

    def __init__(
        self,
        topology: Topology,
        *,
        cost_model: EmbeddingCostModel | None = None,
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
            plans.append(TablePlan(spec.name, t, o.sharding, shards))
        plan = ShardingPlan(options.topology.world_size, tuple(plans))
        plan.validate(options.tables)
        per_rank = options.cost_model.rank_costs(plan, options.tables, self.topology)
        return ShardingPlan(plan.world_size, plan.tables, per_rank)


def plan_tables(tables, topology: Topology, **stages) -> ShardingPlan:
    """``EmbeddingShardingPlanner(topology, **stages).plan(tables)``."""
    return EmbeddingShardingPlanner(topology, **stages).plan(tables)


def lower_bound(options: OptionSet) -> float:
    """No plan's slowest rank costs less: max(sum of each table's cheapest total / K, its cheapest peak)."""
    k = options.topology.world_size
    budget = max(options.topology.memory_per_rank)
    total, peak = 0.0, 0.0
    for opts in options.options:
        fit = [o for o in opts if o.max_memory <= budget] or list(opts)
        total += min(o.total_cost for o in fit)
        peak = max(peak, min(o.peak_cost for o in fit))
    return max(total / k, peak)


__all__ += ["lower_bound"]
