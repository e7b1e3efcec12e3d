"""`haloflow train dlrm`: flags into the config, user errors as one line, a summary table for people."""

import json

import pytest

from haloflow.cli import build_parser, main
from haloflow.cli.train_dlrm import config_from_args


def _parse(argv):
    return build_parser().parse_args(["train", "dlrm", *argv])


def test_arguments_become_the_config(tmp_path):
    args = _parse(["--data", str(tmp_path), "--plan", "p.json", "--batch-size", "64", "--bottom-mlp", "32,16",
                   "--dp-grad", "dense", "--no-k-invariance", "--max-steps", "7", "--device", "cpu", "--timeout", "9",
                   "--log-jsonl", str(tmp_path / "m.jsonl")])
    c = config_from_args(args)
    assert (c.data, c.plan, c.batch_size, c.bottom_mlp, c.dp_grad, c.max_steps) == (
        tmp_path, tmp_path.__class__("p.json"), 64, (32, 16), "dense", 7)
    assert c.lr == 0.1 and c.top_mlp == (512, 256) and not c.synthetic and c.no_k_invariance
    assert (c.runtime.device, c.runtime.timeout_s, c.runtime.log_jsonl) == ("cpu", 9.0, tmp_path / "m.jsonl")


def test_bad_widths_are_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        _parse(["--synthetic", "--top-mlp", "512,x"])
    assert "expected comma-separated integers like 512,256,64, got '512,x'" in capsys.readouterr().err


def test_user_errors_are_one_line_and_exit_2(tmp_path, cli_fails):
    cli_fails(["train", "dlrm", "--synthetic", "--batch-size", "0"], "--batch-size: batch_size must be >= 1, got 0")
    cli_fails(["train", "dlrm", "--synthetic", "--lr", "0"], "lr must be a finite number > 0, got 0.0")
    cli_fails(["train", "dlrm", "--data", tmp_path / "missing"], "missing", "metadata.json")
    cli_fails(["train", "dlrm", "--synthetic", "--timeout", "-1"], "--timeout: timeout_s must be")
    cli_fails(["train", "dlrm", "--synthetic", "--log-jsonl", tmp_path], "is a folder")


def test_people_get_a_table_and_programs_get_json_lines(tmp_path, capsys):
    log = tmp_path / "m.jsonl"
    assert main(["train", "dlrm", "--synthetic", "--synthetic-max-rows", "40", "--synthetic-train", "96",
                 "--synthetic-val", "0", "--batch-size", "32", "--embedding-dim", "4", "--bottom-mlp", "8",
                 "--top-mlp", "8", "--log-every", "1", "--no-progress", "--log-jsonl", str(log)]) == 0
    out = capsys.readouterr().out
    assert "samples / s" in out and "ranks x threads" in out and "start-up s" in out
    assert not any(line.startswith("{") for line in out.splitlines())  # JSON goes to the file
    records = [json.loads(x) for x in log.read_text().splitlines()]
    assert [r["kind"] for r in records] == ["train"] * 3 + ["summary"]
    assert records[-1]["metrics"]["val_auc"] is None  # no validation samples: null, not NaN (which is not JSON)


@pytest.mark.slow
def test_a_mistake_found_by_the_ranks_ends_in_one_line_naming_the_rank_and_exit_2(tmp_path):
    """Under --nproc, a rank that stops on a user's mistake leaves its line for the launcher, which repeats it last,
    with the rank, and exits 2 (torchrun alone would exit 1 after its own traceback)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    plan = tmp_path / "plan.json"  # valid JSON for 2 ranks, but no tables: only the ranks' model can tell
    plan.write_text(json.dumps({"format": "haloflow.sharding_plan", "version": 1, "world_size": 2, "tables": [],
                                "per_rank": []}))
    proc = subprocess.run([sys.executable, "-m", "haloflow", "train", "dlrm", "--synthetic", "--plan", str(plan),
                           "--nproc", "2", "--max-steps", "2"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("haloflow train: error: rank ") and "of 2: plan has 0 tables but the model has 26" in last


@pytest.mark.parametrize("typed, optimizer, lr", [("sgd", "sgd", 0.1), ("adagrad", "adagrad", 0.01),
                                                  ("rowwise_adagrad", "rowwise_adagrad", 0.01),
                                                  ("rowwise-adagrad", "rowwise_adagrad", 0.01)])
def test_the_default_lr_follows_the_optimizer_and_both_spellings_are_taken(typed, optimizer, lr):
    c = config_from_args(_parse(["--synthetic", "--optimizer", typed]))
    assert (c.optimizer, c.lr) == (optimizer, lr)
    assert config_from_args(_parse(["--synthetic", "--optimizer", typed, "--lr", "0.3"])).lr == 0.3


def test_help_shows_each_optimizers_default_lr(capsys):
    with pytest.raises(SystemExit):
        _parse(["--help"])
    assert "per optimizer: sgd 0.1, adagrad 0.01, rowwise_adagrad 0.01" in " ".join(capsys.readouterr().out.split())


def _policy_choices() -> tuple[str, ...]:
    """The choices of ``--cache-policy``, read from the field that declares the flag."""
    from dataclasses import fields

    from haloflow.engine.dlrm.config import DLRMTrainConfig
    from haloflow.utils.config_flags import cli_meta

    return next(cli_meta(f).choices for f in fields(DLRMTrainConfig) if f.name == "cache_policy")


@pytest.mark.parametrize("policy", _policy_choices())
def test_every_cache_policy_the_command_line_offers_trains(policy, tmp_path):
    """Each ``--cache-policy`` choice trains from the command line ("frequency" counts its histogram from the
    batches the run trains on; it used to stop at setup asking for one)."""
    log = tmp_path / "m.jsonl"
    assert main(["train", "dlrm", "--synthetic", "--synthetic-max-rows", "40", "--synthetic-train", "96",
                 "--batch-size", "32", "--max-steps", "3", "--cache-ratio", "0.1", "--cache-policy", policy,
                 "--optimizer", "adagrad", "--no-progress", "--log-jsonl", str(log)]) == 0
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert records[-1]["kind"] == "summary" and records[-1]["metrics"]["cache_hit_rate"] >= 0.0, records[-1]

