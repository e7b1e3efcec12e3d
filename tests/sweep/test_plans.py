"""The sweep over sharding plans (``load_plan``: what ``train dlrm --plan`` reads) and table-spec files (what
``plan-tables --tables FILE`` reads, JSON and CSV): a valid file, then its JSON values or its bytes broken."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from haloflow.partition.planner.plan_io import load_plan, save_plan
from haloflow.partition.planner.planner import EmbeddingShardingPlanner
from haloflow.partition.planner.specs import load_table_specs
from haloflow.partition.planner.types import TableSpec, Topology
from tests.sweep.mutate import SWEEP, check_clean, mutate, mutate_json

pytestmark = pytest.mark.timeout(300)

SPECS = [{"name": "users", "num_rows": 5000, "dim": 8, "pooling_factor": 2.0},
         {"name": "ads", "num_rows": 40, "dim": 8}, {"name": "items", "num_rows": 100_000, "dim": 16}]


@pytest.fixture(scope="module")
def plan_text(tmp_path_factory):
    specs = tuple(TableSpec(name=s["name"], num_rows=s["num_rows"], dim=s["dim"]) for s in SPECS)
    plan = EmbeddingShardingPlanner(Topology(world_size=3, memory_per_rank=(64e6,))).plan(specs)
    return save_plan(plan, tmp_path_factory.mktemp("plan") / "plan.json").read_text()


@settings(max_examples=250, **SWEEP)
@given(st.data())
def test_plan_files(plan_text, data):
    if data.draw(st.booleans()):
        raw = json.dumps(mutate_json(data, json.loads(plan_text))).encode()
    else:
        raw = mutate(data, plan_text.encode(), compress=False)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.json"
        path.write_bytes(raw)
        check_clean("plan JSON (train dlrm --plan)", lambda: load_plan(path), "plan.json")


@settings(max_examples=150, **SWEEP)
@given(st.data())
def test_table_spec_files(data):
    csv = data.draw(st.booleans())
    if csv:
        text = "name,num_rows,dim,pooling_factor\n" + "".join(
            f"{s['name']},{s['num_rows']},{s['dim']},{s.get('pooling_factor', 1)}\n" for s in SPECS)
        raw = mutate(data, text.encode(), compress=False)
    elif data.draw(st.booleans()):
        raw = json.dumps(mutate_json(data, {"tables": SPECS})).encode()
    else:
        raw = mutate(data, json.dumps({"tables": SPECS}).encode(), compress=False)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("tables.csv" if csv else "tables.json")
        path.write_bytes(raw)
        check_clean("table specs (plan-tables --tables FILE)", lambda: load_table_specs(path), path.name)
