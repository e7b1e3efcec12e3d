import argparse

import pytest

from haloflow.cli.train_dlrm import add_arguments, config_from_args, main


def _parse(argv):
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


def test_arguments_become_the_config(tmp_path):
    args = _parse(["--data", str(tmp_path), "--plan", "p.json", "--batch-size", "64", "--bottom-mlp", "32,16",
                   "--dp-grad", "dense", "--max-steps", "7"])
    c = config_from_args(args)
    assert (c.data, c.plan, c.batch_size, c.bottom_mlp, c.dp_grad, c.max_steps) == (
        tmp_path, tmp_path.__class__("p.json"), 64, (32, 16), "dense", 7)
    assert c.lr == 0.1 and c.top_mlp == (512, 256) and not c.synthetic


def test_bad_widths_are_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        _parse(["--synthetic", "--top-mlp", "512,x"])
    assert "expected comma-separated integers like 512,256,64, got '512,x'" in capsys.readouterr().err


def test_user_errors_are_one_line_and_exit_2(tmp_path, capsys):
    assert main(["--synthetic", "--batch-size", "0"]) == 2
    assert capsys.readouterr().err.strip() == "haloflow train dlrm: error: batch_size must be >= 1, got 0"
    assert main(["--data", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing" in err[0] and "metadata.json" in err[0]


def test_reachable_as_haloflow_train_dlrm(capsys):
    from haloflow.cli import main as haloflow_main

    assert haloflow_main(["train", "dlrm", "--synthetic", "--lr", "0"]) == 2
    assert capsys.readouterr().err.strip() == "haloflow train: error: lr must be a finite number > 0, got 0.0"
