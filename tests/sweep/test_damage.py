"""DAMAGE: a command that replaced or deleted what it did not write (issue 37). Each case names the files that
must stay byte for byte as they were; an output is replaced only when haloflow wrote it, or with --overwrite."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.sweep.cases import DLRM, GCN, TGN, Case, dead_pid, run_case

pytestmark = pytest.mark.timeout(300)


def _dlrm_run(tmp: Path) -> None:
    """A DLRM run's checkpoint folder (step-00000002 and -00000004) at tmp/dlrm-ck."""
    from haloflow.cli import main

    assert main([*DLRM, "--max-steps", "4", "--checkpoint-dir", str(tmp / "dlrm-ck"), "--checkpoint-every", "2"]) == 0


def _gcn_and_dlrm_runs(inputs_of):
    def setup(tmp: Path) -> None:
        from haloflow.cli import main

        _dlrm_run(tmp)
        argv = [a.replace("{in}", str(inputs_of())) for a in GCN]
        assert main([*argv, "--checkpoint-dir", str(tmp / "gcn-ck")]) == 0
    return setup


def _their_step_folder(tmp: Path) -> None:
    (tmp / "ck" / "step-00000001").mkdir(parents=True)
    (tmp / "ck" / "step-00000001" / "notes.txt").write_text("my own notes\n")


def _their_folders_beside(tmp: Path) -> None:
    (tmp / "ck" / "step-notes").mkdir(parents=True)
    (tmp / "ck" / "step-notes" / "a.txt").write_text("mine\n")
    (tmp / "ck" / "README").write_text("my checkpoints go here\n")


def _copy_of_data(name: str):
    def setup(tmp: Path) -> None:
        (tmp / name).write_text("id,value\n1,0.5\n2,0.25\n")
    return setup


def _our_log(tmp: Path) -> None:
    (tmp / "m.jsonl").write_text('{"kind": "epoch", "epoch": 1, "loss": 1.0}\n')


def _our_plan(tmp: Path) -> None:
    from haloflow.cli import main

    assert main(["plan-tables", "--tables", str(_inputs() / "tables.json"), "--world-size", "2",
                 "--memory-per-rank", "1GiB", "--out", str(tmp / "plan.json")]) == 0


def _our_model(inputs_of):
    def setup(tmp: Path) -> None:
        from haloflow.cli import main

        assert main([*[a.replace("{in}", str(inputs_of())) for a in GCN], "--save", str(tmp / "model.pt")]) == 0
    return setup


_PREDICT = ("predict", "gcn", "--model", "{tmp}/gcn-ck", "--partitions", "{in}/k1", "--device", "cpu")
_THEIR_PNG = b"\x89PNG\r\n\x1a\n" + b"someone's photo" * 10


def _gcn_checkpoint_and(then):
    """A GCN run's checkpoints at tmp/gcn-ck (the model predict reads), then ``then(tmp)``."""
    def setup(tmp: Path) -> None:
        from haloflow.cli import main

        assert main([*[a.replace("{in}", str(_inputs())) for a in GCN], "--checkpoint-dir", str(tmp / "gcn-ck")]) == 0
        then(tmp)
    return setup


def _their_parquet(tmp: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [1, 2], "value": [0.5, 0.25]}), tmp / "theirs.parquet")


def _predicted(name: str):
    def then(tmp: Path) -> None:
        from haloflow.cli import main

        argv = [a.replace("{in}", str(_inputs())).replace("{tmp}", str(tmp)) for a in _PREDICT]
        assert main([*argv, "--out", str(tmp / name)]) == 0
    return then


def _plotted(tmp: Path) -> None:
    from haloflow.cli import main

    _our_log(tmp)
    assert main(["plot", str(tmp / "m.jsonl"), "--out", str(tmp / "m.png")]) == 0


def _killed_leftovers(*names: str):
    """Temporaries of a run that was killed (its process is gone), named as haloflow names them."""
    def setup(tmp: Path) -> None:
        pid = dead_pid()
        for name in names:
            path = tmp / name.format(pid=pid)
            path.mkdir(parents=True)
            (path / "bucket-0.bin").write_bytes(b"\0" * 64)
    return setup


def _live_leftover(tmp: Path) -> None:
    """A temporary whose process still runs (pid 1): another run's work in progress, never removed."""
    (tmp / ".haloflow-ooc-1-abcdefgh").mkdir()
    (tmp / ".haloflow-ooc-1-abcdefgh" / "bucket-0.bin").write_bytes(b"x")


_INPUTS: list[Path] = []  # the session's inputs folder, for setups that run a command themselves


def _inputs() -> Path:
    return _INPUTS[0]


_SAID = "left by an earlier run that was killed"  # a warning: the log's, so read from caplog (run_case drops it)
_PLAN = ("plan-tables", "--tables", "{in}/tables.json", "--world-size", "2", "--memory-per-rank", "1GiB")
_OOC = ("partition", "{in}/g.txt", "--parts", "2", "--method", "random", "--memory-budget", "4GiB")

CASES = [
    # checkpoints: ownership by record, not by name
    Case("resume-into-another-runs-folder", (*GCN[:5], "4", *GCN[6:], "--resume", "{tmp}/gcn-ck",
                                             "--checkpoint-dir", "{tmp}/dlrm-ck"), 2,
         "holds another run's checkpoints (a dlrm run", keep=("{tmp}/dlrm-ck", "{tmp}/gcn-ck"),
         setup=_gcn_and_dlrm_runs(_inputs)),
    Case("fresh-run-into-another-runs-folder", (*GCN, "--checkpoint-dir", "{tmp}/dlrm-ck"), 2,
         "this run is a gcn run", keep=("{tmp}/dlrm-ck",), setup=lambda tmp: _dlrm_run(tmp)),
    Case("tgn-into-a-dlrm-folder", (*TGN, "--checkpoint-dir", "{tmp}/dlrm-ck"), 2,
         "holds another run's checkpoints", keep=("{tmp}/dlrm-ck",), setup=lambda tmp: _dlrm_run(tmp)),
    Case("their-step-folder-and-keep-1", (*GCN, "--checkpoint-dir", "{tmp}/ck", "--checkpoint-every", "1",
                                          "--checkpoint-keep", "1"), 2,
         "step-00000001 is not a checkpoint of this run", keep=("{tmp}/ck",), setup=_their_step_folder),
    Case("dlrm-their-step-folder", (*DLRM, "--checkpoint-dir", "{tmp}/ck", "--checkpoint-every", "1"), 2,
         "is not a checkpoint of this run", keep=("{tmp}/ck",), setup=_their_step_folder),
    Case("rotation-leaves-their-other-folders", (*GCN[:5], "3", *GCN[6:], "--checkpoint-dir", "{tmp}/ck",
                                                 "--checkpoint-every", "1", "--checkpoint-keep", "1"), 0,
         "step-00000003", keep=("{tmp}/ck/step-notes", "{tmp}/ck/README"), setup=_their_folders_beside),
    # file outputs: replaced only when haloflow's own, or with --overwrite
    Case("gcn-save-over-data", (*GCN, "--save", "{tmp}/data.csv"), 2, "--save", keep=("{tmp}/data.csv",),
         setup=_copy_of_data("data.csv")),
    Case("gcn-save-over-own-model", (*GCN, "--save", "{tmp}/model.pt"), 0, "model.pt",
         setup=_our_model(_inputs)),
    Case("gcn-save-over-data-overwrite", (*GCN, "--save", "{tmp}/data.csv", "--overwrite"), 0, "data.csv",
         setup=_copy_of_data("data.csv")),
    Case("gcn-log-over-data", (*GCN, "--log-jsonl", "{tmp}/data.csv"), 2, "did not write",
         keep=("{tmp}/data.csv",), setup=_copy_of_data("data.csv")),
    Case("dlrm-log-over-data", (*DLRM, "--log-jsonl", "{tmp}/data.csv"), 2, "--log-jsonl",
         keep=("{tmp}/data.csv",), setup=_copy_of_data("data.csv")),
    Case("tgn-log-over-data", (*TGN, "--log-jsonl", "{tmp}/data.csv"), 2, "--overwrite",
         keep=("{tmp}/data.csv",), setup=_copy_of_data("data.csv")),
    Case("gcn-log-over-own-log", (*GCN, "--log-jsonl", "{tmp}/m.jsonl"), 0, "m.jsonl", setup=_our_log),
    Case("plan-out-over-data", (*_PLAN, "--out", "{tmp}/data.csv"), 2, "did not write",
         keep=("{tmp}/data.csv",), setup=_copy_of_data("data.csv")),
    Case("plan-out-over-their-json", (*_PLAN, "--out", "{tmp}/data.json"), 2, "--out",
         keep=("{tmp}/data.json",), setup=lambda tmp: (tmp / "data.json").write_text('{"tables": []}\n')),
    Case("plan-out-over-own-plan", (*_PLAN, "--out", "{tmp}/plan.json"), 0, "plan written", setup=_our_plan),
    Case("plan-out-over-data-overwrite", (*_PLAN, "--out", "{tmp}/data.csv", "--overwrite"), 0, "plan written",
         setup=_copy_of_data("data.csv")),
    Case("bench-out-over-data", ("bench", "halo-build", "--scale", "8", "--parts", "2", "--out", "{tmp}/data.csv"), 2,
         "did not write", keep=("{tmp}/data.csv",), setup=_copy_of_data("data.csv")),
    Case("bench-out-over-their-json", ("bench", "grad-sync", "--ks", "2", "--steps", "1", "--out",
                                       "{tmp}/data.json"), 2, "--overwrite", keep=("{tmp}/data.json",),
         setup=lambda tmp: (tmp / "data.json").write_text('{"mine": 1}\n')),
    Case("predict-out-over-data", (*_PREDICT, "--out", "{tmp}/data.csv"), 2, "did not write",
         keep=("{tmp}/data.csv",), setup=_gcn_checkpoint_and(_copy_of_data("data.csv"))),
    Case("predict-parquet-over-their-parquet", (*_PREDICT, "--out", "{tmp}/theirs.parquet"), 2, "--overwrite",
         keep=("{tmp}/theirs.parquet",), setup=_gcn_checkpoint_and(_their_parquet)),
    Case("predict-embeddings-over-data", (*_PREDICT, "--out", "{tmp}/n.csv", "--embeddings", "{tmp}/data.csv"), 2,
         "--embeddings", keep=("{tmp}/data.csv",), absent=("{tmp}/n.csv",),
         setup=_gcn_checkpoint_and(_copy_of_data("data.csv"))),
    Case("predict-out-over-its-own-csv", (*_PREDICT, "--out", "{tmp}/nodes.csv"), 0, "",
         setup=_gcn_checkpoint_and(_predicted("nodes.csv"))),
    Case("predict-out-over-its-own-parquet", (*_PREDICT, "--out", "{tmp}/nodes.parquet"), 0, "",
         setup=_gcn_checkpoint_and(_predicted("nodes.parquet"))),
    Case("predict-out-over-data-overwrite", (*_PREDICT, "--out", "{tmp}/data.csv", "--overwrite"), 0, "",
         setup=_gcn_checkpoint_and(_copy_of_data("data.csv"))),
    Case("plot-out-over-their-png", ("plot", "{tmp}/m.jsonl", "--out", "{tmp}/photo.png"), 2, "did not write",
         keep=("{tmp}/photo.png",), setup=lambda tmp: (_our_log(tmp), (tmp / "photo.png").write_bytes(_THEIR_PNG))),
    Case("plot-out-over-its-own-png", ("plot", "{tmp}/m.jsonl", "--out", "{tmp}/m.png"), 0, "m.png",
         setup=_plotted),
    # demo: checked before anything is generated
    Case("demo-epochs-0", ("demo", "--epochs", "0", "--out", "{tmp}/demo"), 2, "--epochs", absent=("{tmp}/demo",)),
    Case("demo-hidden-0", ("demo", "--hidden", "0", "--out", "{tmp}/demo"), 2, "--hidden", absent=("{tmp}/demo",)),
    Case("demo-nodes-0", ("demo", "--nodes", "0", "--out", "{tmp}/demo"), 2, "--nodes", absent=("{tmp}/demo",)),
    Case("demo-classes-0", ("demo", "--classes", "0", "--out", "{tmp}/demo"), 2, "--classes",
         absent=("{tmp}/demo",)),
    Case("demo-seed-negative", ("demo", "--seed", "-1", "--out", "{tmp}/demo"), 2, "--seed", absent=("{tmp}/demo",)),
    # a killed run's temporaries: removed by the next run over the same output, which says so
    Case("ooc-leftover-of-a-killed-run", (*_OOC, "--out", "{tmp}/parts"), 0, _SAID,
         setup=_killed_leftovers(".haloflow-ooc-{pid}-abcdefgh")),
    Case("ooc-tmp-dir-leftover", (*_OOC, "--tmp-dir", "{tmp}/scratch", "--out", "{tmp}/parts"), 0, _SAID,
         setup=_killed_leftovers("scratch/.haloflow-ooc-{pid}-abcdefgh")),
    Case("preprocess-leftover-of-a-killed-run", ("preprocess", "clicks", "--train", "20", "--val", "5", "--test", "5",
                                                 "--max-rows", "20", "--out", "{tmp}/clicks"), 0, _SAID,
         setup=_killed_leftovers(".clicks.tmp-{pid}-abcdefgh")),
    Case("partition-old-leftover", ("partition", "{in}/g.txt", "--parts", "2", "--method", "random", "--out",
                                    "{tmp}/parts"), 0, _SAID,
         setup=_killed_leftovers(".parts.tmp-{pid}-abcdefgh", ".parts.old-{pid}-abcdefgh")),
    Case("a-live-runs-temporary-stays", (*_OOC, "--out", "{tmp}/parts"), 0, "parts",
         keep=("{tmp}/.haloflow-ooc-1-abcdefgh",), setup=_live_leftover),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_damage(case_inputs, tmp_path, case, caplog):
    _INPUTS[:] = [case_inputs]
    with caplog.at_level("WARNING"):
        run_case(case, case_inputs, tmp_path, "DAMAGE", logged=lambda: caplog.text)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".haloflow-ooc-") and "-1-" not in p.name]
    assert not list((tmp_path / "scratch").glob(".haloflow-ooc-*")) if (tmp_path / "scratch").is_dir() else True
    assert not [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_a_bench_with_a_missing_data_root_leaves_nothing_in_the_temp_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HALOFLOW_DATA", str(tmp_path / "no-data"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "system-tmp"))
    (tmp_path / "system-tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    run_case(Case("bench-partition-no-data", ("bench", "partition", "--graphs", "enron", "--out", "{tmp}/r.json"), 2,
                  "not found: set HALOFLOW_DATA"), tmp_path, tmp_path, "DAMAGE")
    assert list((tmp_path / "system-tmp").iterdir()) == []


def _kill_when(proc: subprocess.Popen, where: Path, pattern: str, timeout: float = 60.0) -> str:
    """SIGKILL ``proc`` once a temporary matching ``pattern`` appears in ``where``; returns its name."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        found = list(where.glob(pattern))
        if found:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return found[0].name
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    proc.kill()
    pytest.fail(f"no {pattern} appeared in {where} before the run ended")


@pytest.mark.slow
def test_after_sigkill_the_next_run_leaves_no_temporary_of_the_killed_one(tmp_path):
    """Acceptance 3: SIGKILL of `partition --memory-budget` and of `preprocess`, then the same command again."""
    import numpy as np

    np.save(tmp_path / "edges.npy", np.random.default_rng(0).integers(0, 200_000, size=(3_000_000, 2)))
    day = "".join("1\t" + "\t".join(["3"] * 13) + "\t" + "\t".join([f"{i:08x}"] * 26) + "\n" for i in range(40_000))
    (tmp_path / "day_0.txt").write_text(day)
    runs = [(["partition", str(tmp_path / "edges.npy"), "--parts", "4", "--method", "random", "--memory-budget",
              "512MiB", "--out", str(tmp_path / "parts")], ".haloflow-ooc-*"),
            (["preprocess", "criteo", str(tmp_path / "day_0.txt"), "--out", str(tmp_path / "criteo")],
             ".criteo.tmp-*")]
    for argv, pattern in runs:
        proc = subprocess.Popen([sys.executable, "-m", "haloflow", *argv], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        left = _kill_when(proc, tmp_path, pattern)
        assert (tmp_path / left).exists()
        again = subprocess.run([sys.executable, "-m", "haloflow", *argv], capture_output=True, text=True,
                               timeout=300)
        assert again.returncode == 0, again.stderr
        assert "left by an earlier run that was killed" in again.stderr and left in again.stderr
        assert not list(tmp_path.glob(pattern)), pattern
        shutil.rmtree(tmp_path / argv[-1].rsplit("/", 1)[1], ignore_errors=True)
