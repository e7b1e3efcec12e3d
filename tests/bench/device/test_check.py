"""The device check's runner: every part's dry run on this CPU, and what it does with a part that fails or hangs."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from haloflow.bench.device import check

ROOT = Path(__file__).resolve().parents[3]


def _summary(out: Path) -> dict:
    return {o["name"]: o for o in json.loads((out / "summary.json").read_text())}


@pytest.mark.slow
def test_the_script_runs_every_part_at_tiny_sizes_on_a_cpu(tmp_path):
    """`scripts/device_check.sh OUT --device cpu --tiny`: what the GPU machine runs, at dry-run sizes."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh"), str(out), "--device", "cpu", "--tiny"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    outcomes = _summary(out)
    assert list(outcomes) == [p.name for p in check.PARTS]
    assert all(o["status"] == "ok" for o in outcomes.values()), outcomes
    with tarfile.open(out / "device_check.tar.gz") as tar:
        names = set(tar.getnames())
    for part in check.PARTS:
        assert {f"device_check/{part.name}.{ext}" for ext in ("json", "md", "log")} <= names
    text = (out / "summary.md").read_text()
    for part in check.PARTS:  # every part's own tables are in the one summary that comes back
        assert f"## {part.name}" in text
    work = tmp_path / "device_check-work"
    results = {p.name: json.loads((work / f"{p.name}.json").read_text()) for p in check.PARTS}
    assert all(r["ok"] is True and r["tiny"] is True and r["device"] == "cpu" for r in results.values())
    # the comparisons that make each part mean something held in the dry run too
    assert all(g["same_math"] for g in results["gcn_gpu"]["graphs"])
    assert all(r["same"] for r in results["train_parity"]["runs"].values())
    for name in ("1% cached", "5% cached", "1% cached, lookahead", "5% cached, lookahead"):
        assert results["cache_gpu"]["configs"][name]["identical"] is True
    assert results["tgn_gpu"]["checks"]["same_math"] is True and results["tgn_gpu"]["checks"]["same_events"] is True
    for side in ("haloflow", "pyg"):
        assert all(0.0 <= results["tgn_gpu"][side][k] <= 1.0 for k in ("val_ap", "test_ap"))
    scaling = results["cpu_scaling"]
    assert [r["k"] for r in scaling["gcn"]["runs"]] == [1, 2] and all(r["bytes_match"] for r in scaling["gcn"]["runs"])
    assert scaling["tgn"] and all(r["bytes_match"] and r["events_per_s"] > 0 for r in scaling["tgn"])


def test_a_part_that_crashes_is_reported_and_the_next_one_still_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(check, "PARTS", (check.Part("no_such_part", 60), check.Part("cuda_check", 60)))
    rc = check.main(["--device", "cpu", "--tiny", "--out", str(tmp_path)])
    outcomes = _summary(tmp_path)
    assert rc == 1
    assert outcomes["no_such_part"]["status"] == "error" and "exit 1" in outcomes["no_such_part"]["detail"]
    assert outcomes["cuda_check"]["status"] == "ok"
    summary = (tmp_path / "summary.md").read_text()
    assert "No module named" in summary  # the crashed part's log tail is in the summary


def test_a_part_past_its_limit_is_stopped_and_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(check, "TINY_LIMIT_S", 0.3)  # less than a Python start-up with torch
    rc = check.main(["--device", "cpu", "--tiny", "--out", str(tmp_path), "--parts", "cuda_check"])
    assert rc == 1
    assert _summary(tmp_path)["cuda_check"]["status"] == "timeout"


def test_an_unknown_part_is_refused_with_the_list(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        check.main(["--out", str(tmp_path), "--parts", "gcn_gpu,nope"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "unknown part(s) nope" in err and "cuda_check" in err
