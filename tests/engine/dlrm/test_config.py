"""`DLRMTrainConfig`: the learning rate each optimizer gets when none is given, and one spelling of row-wise
Adagrad whichever way it is typed."""

import pytest

from haloflow.engine.dlrm.config import DEFAULT_LR, DLRMTrainConfig
from haloflow.engine.dlrm.train import train_dlrm
from haloflow.engine.runtime import RuntimeConfig
from haloflow.errors import ConfigError


@pytest.mark.parametrize("optimizer, lr", [("sgd", 0.1), ("adagrad", 0.01), ("rowwise_adagrad", 0.01),
                                           ("rowwise-adagrad", 0.01)])
def test_each_optimizer_has_its_own_default_lr(optimizer, lr):
    config = DLRMTrainConfig(synthetic=True, optimizer=optimizer)
    assert config.lr == lr and config.optimizer == optimizer.replace("-", "_")
    assert DLRMTrainConfig(synthetic=True, optimizer=optimizer, lr=0.5).lr == 0.5  # a given rate is kept


def test_an_unknown_optimizer_is_named_before_any_rate_is_picked():
    with pytest.raises(ConfigError, match="optimizer must be one of .*, got 'adam'"):
        DLRMTrainConfig(synthetic=True, optimizer="adam")


@pytest.mark.parametrize("optimizer", ["adagrad", "rowwise_adagrad"])
def test_adagrad_at_its_default_rate_trains_the_synthetic_log_sanely_in_40_steps(optimizer):
    # The run: `haloflow train dlrm --synthetic --max-steps 40 --optimizer adagrad --log-every 1`. At SGD's
    # 0.1, Adagrad's first steps threw the MLPs far: loss 2,979 at step 2. The synthetic log's BCE sits near 0.55.
    result = train_dlrm(DLRMTrainConfig(synthetic=True, max_steps=40, optimizer=optimizer, log_every=1,
                                        max_eval_batches=1, runtime=RuntimeConfig(progress=False)))
    losses = [r["loss"] for r in result.records if r["kind"] == "train"]
    assert len(losses) == 40 and DEFAULT_LR[optimizer] == 0.01
    assert max(losses) < 10, losses[:5]
    assert sum(losses[-10:]) / 10 < 0.7, losses[-10:]


def test_float64_tables_train_with_any_optimizer_but_not_in_a_cache():
    DLRMTrainConfig(synthetic=True, dtype="float64", optimizer="adagrad")  # row stores hold any float type
    with pytest.raises(ConfigError, match="a cache .* holds float32 rows"):
        DLRMTrainConfig(synthetic=True, dtype="float64", cache_ratio=0.1)
