"""Cached tables train the uncached floats: ``haloflow train dlrm --cache-ratio R`` against the same run with every
row in memory, losses compared with ``==`` and the final tables (rows and optimizer state) bit for bit, at K = 1
(the next batch prefetched after each forward) for SGD, Adagrad and row-wise Adagrad, and K = 2 (row-wise Adagrad).

The synthetic log's tables capped at 300 rows and 1 % of them cached (a few slots a table), so rows are evicted
and written back every step; a control with the write-back broken shows the comparison can fail.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from haloflow.cache import batched_cache
from haloflow.engine.checkpoint import newest, open_checkpoint
from haloflow.engine.dlrm.train import DLRMTrainConfig, train_dlrm

RUN = dict(synthetic=True, synthetic_max_rows=300, synthetic_train=2048, synthetic_val=256, batch_size=64,
           embedding_dim=8, bottom_mlp=(16,), top_mlp=(16,), log_every=8, max_eval_batches=2)
CACHED = dict(cache_ratio=0.01)


def _tables(result) -> dict:
    return {k: v for k, v in result.state_dict.items() if k.startswith("embeddings.")}


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad"])
def test_one_process_cached_equals_uncached(optimizer):
    flags = dict(optimizer=optimizer, lr=0.05 if optimizer == "sgd" else 0.01)
    plain = train_dlrm(DLRMTrainConfig(**RUN, **flags))
    cached = train_dlrm(DLRMTrainConfig(**RUN, **CACHED, **flags))
    assert cached.cache["cache_hit_rate"] > 0 and cached.cache["cache_bytes_to_host"] > 0  # it did evict
    assert cached.losses == plain.losses
    assert cached.val_logloss == plain.val_logloss and cached.val_auc == plain.val_auc
    tables, ref = _tables(cached), _tables(plain)
    assert tables.keys() == ref.keys() and all(torch.equal(tables[k], ref[k]) for k in ref)


@pytest.mark.parametrize("policy", ["lfu", "frequency", "lookahead"])
def test_every_cache_policy_keeps_the_floats(policy):
    plain = train_dlrm(DLRMTrainConfig(**RUN, optimizer="adagrad", lr=0.01))
    cached = train_dlrm(DLRMTrainConfig(**RUN, **CACHED, cache_policy=policy, optimizer="adagrad", lr=0.01))
    assert cached.losses == plain.losses
    assert all(torch.equal(a, b) for a, b in zip(_tables(cached).values(), _tables(plain).values()))


def test_a_cache_that_loses_write_backs_is_caught(monkeypatch):
    """Control: victims dropped without their write-back train other floats, and the test above would see it."""
    plan = batched_cache.CachedTables._plan

    def forgetful(self, *args, **kwargs):
        self.dirty.fill_(False)  # every update in a slot is lost when the slot is reused
        return plan(self, *args, **kwargs)

    monkeypatch.setattr(batched_cache.CachedTables, "_plan", forgetful)
    plain = train_dlrm(DLRMTrainConfig(**RUN, optimizer="sgd", lr=0.05))
    cached = train_dlrm(DLRMTrainConfig(**RUN, **CACHED, optimizer="sgd", lr=0.05))
    assert cached.losses != plain.losses


def _cli(tmp, name: str, k: int, *args: str) -> dict:
    out = tmp / name
    cmd = [sys.executable, "-m", "haloflow", "train", "dlrm", "--synthetic", "--synthetic-max-rows", "300",
           "--synthetic-train", "2048", "--synthetic-val", "256", "--batch-size", "64", "--embedding-dim", "8",
           "--bottom-mlp", "16", "--top-mlp", "16", "--log-every", "1", "--max-eval-batches", "2", "--no-progress",
           "--max-steps", "32",
           "--nproc", str(k), "--device", "cpu", "--log-jsonl", str(out / "log.jsonl"),
           "--checkpoint-dir", str(out / "ck"), "--checkpoint-every", "32", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return {"losses": [r["loss"] for r in records if r.get("kind") == "train"],
            "digest": open_checkpoint(newest(out / "ck")).digest(),
            "summary": next(r for r in records if r.get("kind") == "summary")["metrics"]}


@pytest.mark.slow
def test_two_ranks_cached_equal_one_process_uncached(tmp_path):
    """Each rank's tables in its own cache (V = 4 logical workers on 2 ranks), lookahead, each next batch
    prefetched, against every row in memory in one process: every loss and the final checkpoint's digest (rows
    and optimizer state, in global terms). Row-wise Adagrad: its per-row accumulator makes a lost or doubled
    update show in every column. Each rank tells its cache, from the global batch, the ids the exchange will
    bring it: every plan but the first was made ahead and from an announcement (the received ids matched)."""
    args = ("--optimizer", "rowwise_adagrad", "--lr", "0.01")
    one = _cli(tmp_path, "one", 1, *args)
    two = _cli(tmp_path, "two", 2, *args, "--cache-ratio", "0.01", "--cache-policy", "lookahead",
               "--cache-window", "4")
    assert len(one["losses"]) == 32 and two["losses"] == one["losses"]
    assert two["digest"] == one["digest"]
    metrics = two["summary"]
    assert metrics["cache_prefetched"] == 31 / 32 and metrics["cache_announced"] == 1.0, metrics
