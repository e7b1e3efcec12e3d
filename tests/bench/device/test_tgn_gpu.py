"""The tgn_gpu part: a missing event stream is a failed part that names the path it looked for (its dry run on a CPU
is part of tests/bench/device/test_check.py)."""

import json

from haloflow.bench.device.tgn_gpu import main


def test_a_missing_event_stream_fails_the_part_and_names_the_path(tmp_path, capsys):
    missing = tmp_path / "nowhere" / "wiki.csv"
    assert main(["--device", "cpu", "--tiny", "--out", str(tmp_path), "--events", str(missing)]) == 1
    assert str(missing) in capsys.readouterr().err
    out = json.loads((tmp_path / "tgn_gpu.json").read_text())
    assert out["ok"] is False and out["events"] == str(missing)
