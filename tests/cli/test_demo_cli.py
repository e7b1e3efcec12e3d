import pytest

from haloflow.cli import main


@pytest.mark.slow
def test_demo_trains_the_same_model_on_one_and_two_processes(tmp_path, capsys):
    code = main(["demo", "--nodes", "600", "--classes", "4", "--epochs", "5", "--hidden", "8",
                 "--out", str(tmp_path / "demo")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "epochs whose loss differs: 0 of 5 -> the same model, bit for bit" in out
    assert (tmp_path / "demo" / "parts-2" / "meta.json").is_file()
    assert (tmp_path / "demo" / "train-2.jsonl").read_text().count("\n") == 5 + 1  # epochs, then the summary
    assert "ranks x threads" in out and "start-up s" in out and "ms / epoch" in out


@pytest.mark.parametrize("k, message", [("0", "--nproc must be >= 1, got 0"),
                                        ("3", "--nproc must be a power of two (one process hosts all K parts")])
def test_demo_rejects_a_bad_process_count(tmp_path, capsys, k, message):
    assert main(["demo", "--nproc", k, "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_demo_rejects_a_file_as_out(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    assert main(["demo", "--out", str(tmp_path / "f")]) == 2
    err = capsys.readouterr().err
    assert "is a file; expected a folder" in err and "Traceback" not in err
