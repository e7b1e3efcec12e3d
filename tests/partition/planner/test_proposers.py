from haloflow.partition.planner.cost_model import EmbeddingCostModel
from haloflow.partition.planner.enumerators import ShardingOptionEnumerator
from haloflow.partition.planner.partitioners import GreedyCostPartitioner
from haloflow.partition.planner.planner import plan_tables
from haloflow.partition.planner.proposers import GreedyProposer
from haloflow.partition.planner.types import ShardingType, TableSpec, Topology

MiB = 2**20


def test_first_proposal_replicates_what_memory_allows_best_savings_per_byte_first():
    # On a slow network replication is cheaper for all three; a 2 MiB budget holds the two small replicas
    # (0.04 and 0.6 MiB) and an even share of the 1.5 MiB table, not a third replica.
    specs = (TableSpec(name="small", num_rows=10, dim=1024), TableSpec(name="mid", num_rows=100, dim=1600),
             TableSpec(name="big", num_rows=250, dim=1600))
    topo = Topology(world_size=2, memory_per_rank=2 * MiB, a2a_bandwidth=1e6, allreduce_bandwidth=1e6)
    options = ShardingOptionEnumerator(cost_model=EmbeddingCostModel(dp_grad="dense")).enumerate(specs, topo)
    assert all(opts[0].fixed_ranks for opts in options.options)  # replicas are cheapest for all
    proposer = GreedyProposer()
    proposer.load(options)
    first = proposer.propose()
    kinds = [options.options[t][c].sharding for t, c in enumerate(first)]
    assert kinds[:2] == [ShardingType.DATA_PARALLEL] * 2 and kinds[2] is not ShardingType.DATA_PARALLEL


def test_cuts_tables_finer_until_they_pack():
    # three 6 MiB tables, two ranks of 10 MiB: each fits a rank alone, but not all three whole
    specs = [TableSpec(name=f"t{i}", num_rows=98_304, dim=16) for i in range(3)]
    plan = plan_tables(specs, Topology(world_size=2, memory_per_rank=10 * MiB))
    assert all(c.memory.device <= 10 * MiB for c in plan.per_rank)
    assert sorted(len(tp.shards) for tp in plan.tables) == [1, 1, 2]


def test_stops_after_max_proposals():
    # big tables with dense gradient sync: all model-parallel, so the slowest rank has tables to re-shard
    specs = [TableSpec(name=f"t{i}", num_rows=100_000 * (i + 1), dim=16) for i in range(10)]
    topo = Topology(world_size=4, memory_per_rank=2**30)
    options = ShardingOptionEnumerator(cost_model=EmbeddingCostModel(dp_grad="dense")).enumerate(tuple(specs), topo)
    proposer = GreedyProposer(max_proposals=3)
    proposer.load(options)
    seen = 0
    while (choice := proposer.propose()) is not None:
        seen += 1
        proposer.feedback(GreedyCostPartitioner().partition(options, choice))
    assert seen == 3
