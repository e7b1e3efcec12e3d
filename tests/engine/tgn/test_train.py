"""Distributed TGN: K = 2 and 4 real gloo processes, node memory owned by partition, equal one process."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from haloflow.engine.runtime import RuntimeConfig
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
    # K ranks run the same math on other batch shapes: float32 rounding differs, and Adam carries it over 20 steps
    # (a wrong row or a lost message moves these by orders of magnitude more)
    close = dict(atol=1e-4, rtol=1e-3)
    for r in range(k):
        got = dict(np.load(tmp_path / f"rank{r}.npz"))
        assert len(got["losses"]) == BATCHES
        torch.testing.assert_close(torch.from_numpy(got["losses"]), torch.tensor(ref.batch_losses),
                                   check_dtype=False, **close)
        torch.testing.assert_close(torch.from_numpy(got["memory"]), full.memory, **close)
        torch.testing.assert_close(torch.from_numpy(got["mail_other"]), full.mail_other, **close)
        assert np.array_equal(got["last_update"], full.last_update.numpy())
        assert np.array_equal(got["mail_eid"], full.mail_eid.numpy())
        for name, w in ref.state_dict.items():
            torch.testing.assert_close(torch.from_numpy(got[f"w_{name}"]), w, msg=name, **close)
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
