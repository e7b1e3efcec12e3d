"""Distributed TGN: K = 2 and 4 real gloo processes, node memory owned by partition, equal one process."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from haloflow.engine.runtime import RuntimeConfig
from haloflow.engine.tgn.config import default_logical_workers
from haloflow.engine.tgn.memory import NodeOwners
from haloflow.engine.tgn.train import TGNTrainConfig, train_tgn
from haloflow.errors import ConfigError
from tests.conftest import run_torchrun

SCRIPTS = Path(__file__).parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))
from tgn_parity import BATCHES, config, stream  # noqa: E402


def test_node_blocks_cover_every_node_once():
    owners = NodeOwners.blocks(10, 3)
    assert owners.counts == (4, 3, 3)
    assert owners.owner.tolist() == [0] * 4 + [1] * 3 + [2] * 3
    assert owners.row.tolist() == [0, 1, 2, 3, 0, 1, 2, 0, 1, 2]


def test_config_names_the_field():
    with pytest.raises(ConfigError, match="batch_size must be >= 1, got 0") as err:
        TGNTrainConfig(events="x", batch_size=0)
    assert err.value.field == "batch_size"
    with pytest.raises(ConfigError, match="schedule must be one of"):
        TGNTrainConfig(events="x", schedule="never")


def test_v_defaults_to_4_so_that_1_2_and_4_ranks_share_it():
    assert [default_logical_workers(k) for k in (1, 2, 3, 4, 8)] == [4, 4, 6, 4, 8]
    cfg = TGNTrainConfig(events="x")
    assert [cfg.logical_workers_for(k) for k in (1, 2, 4)] == [4, 4, 4]
    assert TGNTrainConfig(events="x", partitions="p").logical_workers_for(2, parts=8) == 8  # the folder's parts
    assert TGNTrainConfig(events="x", k_invariant=False).logical_workers_for(2) == 2  # V = K


@pytest.mark.parametrize("kwargs, k, parts, match, field", [
    ({"logical_workers": 4}, 3, None, r"V = 4 logical workers on 3 ranks: .* --nproc in \[1, 2, 4\]",
     "logical_workers"),
    ({"logical_workers": 6}, 2, None, r"V / K = 6 / 2", "logical_workers"),  # 3 per rank: not a power of two
    ({"logical_workers": 8, "partitions": "p4"}, 2, 4, "p4 has 4 parts, but the run has V = 8 .* --logical-workers 4",
     "logical_workers"),
    ({"k_invariant": False, "partitions": "p4"}, 2, 4, r"start 4 ranks \(--nproc 4\)", "nproc"),
])
def test_a_v_that_k_cannot_host_names_the_fix(kwargs, k, parts, match, field):
    with pytest.raises(ConfigError, match=match) as err:
        TGNTrainConfig(events="x", **kwargs).logical_workers_for(k, parts)
    assert err.value.field == field


def test_logical_workers_and_no_k_invariance_exclude_each_other():
    with pytest.raises(ConfigError, match="--logical-workers 4 with --no-k-invariance") as err:
        TGNTrainConfig(events="x", logical_workers=4, k_invariant=False)
    assert err.value.field == "logical_workers"
    with pytest.raises(ConfigError, match="logical_workers must be >= 1, got 0"):
        TGNTrainConfig(events="x", logical_workers=0)


def test_a_checkpoint_of_another_v_is_refused_naming_v(tmp_path):
    from haloflow.engine.checkpoint import CheckpointConfig
    from haloflow.errors import CheckpointError

    def run(v, **ckpt):
        return train_tgn(TGNTrainConfig(**{**config().__dict__, "max_train_batches": 2, "logical_workers": v,
                                           "runtime": RuntimeConfig(device="cpu", progress=False,
                                                                    checkpoint=CheckpointConfig(**ckpt))}),
                         events=stream())

    assert run(4, dir=tmp_path / "ck").layout.world_size == 1
    with pytest.raises(CheckpointError, match="logical_workers differs: the checkpoint has 4, this run has 2"):
        run(2, resume=tmp_path / "ck")


def test_one_process_learns_and_reports(tmp_path):
    cfg = config()
    result = train_tgn(TGNTrainConfig(**{**cfg.__dict__, "max_train_batches": None, "eval": True, "epochs": 2,
                                         "mrr_events": 128,
                                         "runtime": RuntimeConfig(device="cpu", progress=False,
                                                                  log_jsonl=tmp_path / "t.jsonl")}),
                       events=stream())
    assert result.epoch_losses[1] < result.epoch_losses[0]
    m = result.metrics
    assert 0.5 < m["test_ap"] <= 1 and 0.5 < m["test_auc"] <= 1 and 0 < m["test_mrr"] <= 1
    assert result.devices == {"model": {"cpu"}, "memory": {"cpu"}}
    assert (tmp_path / "t.jsonl").read_text().count("\n") == 3  # two epochs and the summary


@pytest.mark.slow
@pytest.mark.parametrize("k, schedule", [(2, "overlap"), (4, "wait_first")])
def test_k_ranks_train_what_one_process_trains(tmp_path, k, schedule):
    proc = run_torchrun(SCRIPTS / "tgn_parity.py", k, [tmp_path, schedule], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank: one thread, so threaded reductions do not add their own rounding
    try:
        ref = train_tgn(config(), events=stream())
    finally:
        torch.set_num_threads(threads)
    full = ref.memory.gather_all()
    # V = 4 logical workers at K = 1, 2 and 4: the same slices, the same sums, the same bits (issue 33)
    assert ref.layout.world_size == 1
    for r in range(k):
        got = dict(np.load(tmp_path / f"rank{r}.npz"))
        assert got["losses"].tolist() == ref.batch_losses and len(ref.batch_losses) == BATCHES
        for name in ("memory", "mail_other", "last_update", "mail_eid"):
            assert np.array_equal(got[name], getattr(full, name).numpy()), name
        for name, w in ref.state_dict.items():
            assert np.array_equal(got[f"w_{name}"], w.numpy()), name
        assert got["fetch_bytes"] > 0  # rows really crossed between ranks


def test_resumed_mid_epoch_equals_the_uninterrupted_run(tmp_path):
    """Memory, mailbox, model and Adam come back from a checkpoint taken inside an epoch (and across one)."""
    from haloflow.engine.checkpoint import CheckpointConfig

    def run(**ckpt):
        return train_tgn(TGNTrainConfig(**{**config().__dict__, "max_train_batches": 6, "epochs": 2,
                                           "runtime": RuntimeConfig(device="cpu", progress=False,
                                                                    checkpoint=CheckpointConfig(**ckpt))}),
                         events=stream())

    full = run()
    run(dir=tmp_path / "ck", every=4, keep=3)  # batches 4, 8, 12 (6 a epoch)
    for step in (4, 8):
        resumed = run(resume=tmp_path / "ck" / f"step-{step:08d}")
        assert resumed.resumed_at == step  # continued from the checkpoint, not trained again from scratch
        assert resumed.batch_losses == full.batch_losses and resumed.epoch_losses == full.epoch_losses
        for name, w in full.state_dict.items():
            assert torch.equal(w, resumed.state_dict[name]), name
        a, b = full.memory.gather_all(), resumed.memory.gather_all()
        for name in ("memory", "last_update", "mail_other", "mail_feat", "mail_t", "mail_eid"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
