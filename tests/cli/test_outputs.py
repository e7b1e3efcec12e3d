"""What the commands do to the outputs they are given (issue 17): a link, a FIFO or a device is written through
and stays what it was; ``--overwrite`` replaces only a folder of ours; a full disk is one line naming the path and
leaves no temporary; ``--log-jsonl`` is a stream from its first line."""

import json
import os
import stat
import subprocess
import sys

import numpy as np
import pytest
import torch

from haloflow.cli import main
from haloflow.partition.api import PartitionConfig
from haloflow.partition.pipeline import partition_dataset
from tests.conftest import REPO, fill_disk, reading_fifo
from tests.engine.scripts.common import small_dataset

CRITEO_LINE = "1\t" + "\t".join(["3"] * 13) + "\t" + "\t".join(["68fd1e64"] * 26) + "\n"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("outputs")
    dataset = small_dataset(num_nodes=60, num_edges=200, feat_dim=4, num_classes=3, seed=2)
    for k in (1, 2):
        partition_dataset(dataset, PartitionConfig(num_parts=k, method="random"), root / f"k{k}", progress=False)
    (root / "day_0.txt").write_text(CRITEO_LINE * 14)
    edges = np.random.default_rng(0).integers(0, 3000, size=(20_000, 2))
    (root / "g.txt").write_text("".join(f"{u}\t{v}\n" for u, v in edges))
    return root


def _gcn(inputs, *flags, k=1):
    return ["train", "gcn", "--partitions", str(inputs / f"k{k}"), "--epochs", "2", "--hidden", "8", "--no-progress",
            *map(str, flags)]


def _haloflow(argv, timeout=180):
    return subprocess.run([sys.executable, "-m", "haloflow", *map(str, argv)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


# ----------------------------------------------------------------------------- item 1: write through, never replace
def test_a_log_linked_to_stdout_goes_to_stdout_and_the_link_stays(inputs, tmp_path):
    link = tmp_path / "out.jsonl"
    link.symlink_to("/proc/self/fd/1")
    proc = _haloflow(_gcn(inputs, "--log-jsonl", link))
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["kind"] for r in records] == ["epoch", "epoch", "summary"]
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"


def test_save_and_log_through_links_to_files_keep_the_links(inputs, tmp_path):
    theirs = {name: tmp_path / f"theirs.{name}" for name in ("pt", "jsonl")}
    for path in theirs.values():
        path.write_text("old")
    links = {name: tmp_path / f"link.{name}" for name in theirs}
    for name, link in links.items():
        link.symlink_to(theirs[name])
    assert main(_gcn(inputs, "--save", links["pt"], "--log-jsonl", links["jsonl"])) == 0
    assert all(link.is_symlink() for link in links.values())
    assert "state_dict" in torch.load(theirs["pt"]) and theirs["jsonl"].read_text().count("\n") == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.jsonl", "link.pt", "theirs.jsonl", "theirs.pt"]


def test_a_fifo_log_is_read_as_it_is_written(inputs, tmp_path):
    fifo = tmp_path / "log.fifo"
    with reading_fifo(fifo) as got:
        assert main(_gcn(inputs, "--log-jsonl", fifo)) == 0
    assert got and got[0].count(b"\n") == 3 and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_devices_are_written_through_and_stay_devices(inputs, device_nodes, cli_fails):
    assert main(_gcn(inputs, "--save", device_nodes["null"], "--log-jsonl", device_nodes["full"].parent / "l")) == 0
    cli_fails(_gcn(inputs, "--save", device_nodes["full"]), f"cannot write {device_nodes['full']}: no space left")
    cli_fails(_gcn(inputs, "--log-jsonl", device_nodes["full"]), "no space left on device")
    cli_fails(["plan-tables", "--tables", "kaggle", "--world-size", "2", "--memory-per-rank", "4GiB", "--out",
               device_nodes["full"]], "no space left on device")
    for node in device_nodes.values():
        assert stat.S_ISCHR(os.lstat(node).st_mode)
    assert sorted(p.name for p in device_nodes["null"].parent.iterdir()) == ["dev-full", "dev-null", "l"]


# ----------------------------------------------------------------------------- item 2: --overwrite and foreign folders
@pytest.mark.parametrize("dataset", ["criteo", "clicks"])
def test_preprocess_overwrite_never_deletes_a_folder_of_someone_elses(inputs, tmp_path, cli_fails, dataset):
    source = [str(inputs / "day_0.txt")] if dataset == "criteo" else ["--train", "20", "--val", "5", "--test", "5",
                                                                      "--max-rows", "20"]
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "mine.txt").write_text("x")
    cli_fails(["preprocess", dataset, *source, "--out", notes, "--overwrite"],
              f"refusing to replace {notes}: it is not a click-log folder written by haloflow")
    (notes / "metadata.json").write_text('{"format": "my-notes"}')  # a metadata file, but another program's
    cli_fails(["preprocess", dataset, *source, "--out", notes, "--overwrite"], "refusing to replace")
    assert sorted(p.name for p in notes.iterdir()) == ["metadata.json", "mine.txt"]
    ours = tmp_path / "ours"
    assert main(["preprocess", dataset, *source, "--out", str(ours)]) == 0
    assert main(["preprocess", dataset, *source, "--out", str(ours), "--overwrite"]) == 0  # our own: replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "ours"]


def test_partition_overwrite_refuses_a_foreign_meta_json(inputs, tmp_path, cli_fails):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "meta.json").write_text('{"title": "my notes"}')
    cli_fails(["partition", inputs / "g.txt", "--parts", 2, "--method", "random", "--out", notes, "--overwrite"],
              "it is not a partition folder")
    assert (notes / "meta.json").read_text() == '{"title": "my notes"}'


# ----------------------------------------------------------------------------- item 5: a full disk
def _only_filler(where, *also):
    assert sorted(p.name for p in where.iterdir()) == sorted(["filler", *also])


@pytest.mark.parametrize("what", ["partition", "preprocess criteo", "preprocess clicks", "plan-tables", "save"])
def test_a_full_disk_is_one_line_and_leaves_nothing(inputs, small_tmpfs, cli_fails, what):
    fill_disk(small_tmpfs, leave=8_000)
    out = small_tmpfs / "out"
    argv = {
        "partition": ["partition", inputs / "g.txt", "--parts", 2, "--method", "random", "--out", out],
        "preprocess criteo": ["preprocess", "criteo", inputs / "day_0.txt", "--out", out],
        "preprocess clicks": ["preprocess", "clicks", "--out", out, "--train", 2000],
        "plan-tables": ["plan-tables", "--tables", "kaggle", "--world-size", 2, "--memory-per-rank", "4GiB", "--out",
                        out],
        "save": _gcn(inputs, "--save", out, "--hidden", 300, "--layers", 3),
    }[what]
    cli_fails(argv, f"cannot write {out}: no space left on device")
    _only_filler(small_tmpfs)


def test_a_checkpoint_on_a_full_disk_stops_the_run_with_one_line(inputs, small_tmpfs, cli_fails, tmp_path):
    fill_disk(small_tmpfs, leave=100_000)
    ckpt, log = small_tmpfs / "ckpt", tmp_path / "log.jsonl"
    cli_fails(_gcn(inputs, "--checkpoint-dir", ckpt, "--checkpoint-every", 1, "--hidden", 300, "--layers", 3,
                   "--log-jsonl", log),
              f"cannot write {ckpt / 'step-00000001'}: no space left on device; this checkpoint is not written")
    _only_filler(small_tmpfs, "ckpt")
    assert list(ckpt.iterdir()) == []  # no .step-00000001.tmp left
    assert [json.loads(x)["epoch"] for x in log.read_text().splitlines()] == [0]  # the epoch before it


@pytest.mark.slow
def test_a_checkpoint_on_a_full_disk_stops_both_ranks(inputs, small_tmpfs):
    fill_disk(small_tmpfs, leave=100_000)
    ckpt = small_tmpfs / "ckpt"
    proc = _haloflow(_gcn(inputs, "--nproc", 2, "--checkpoint-dir", ckpt, "--checkpoint-every", 1, "--hidden", 300,
                          "--layers", 3, k=2))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert f"cannot write {ckpt / 'step-00000001'}: no space left on device" in lines[0]
    assert list(ckpt.iterdir()) == []


# ----------------------------------------------------------------------------- item 6: the log is a stream
def test_a_killed_run_keeps_the_lines_it_logged_and_a_new_run_truncates(inputs, tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text('{"kind": "epoch", "epoch": 9}\n' * 5)  # an old run's log: ours, so replaced
    proc = _haloflow(_gcn(inputs, "--epochs", 5, "--fail-at", 3, "--log-jsonl", log))
    assert proc.returncode == -9, proc.stderr[-2000:]  # SIGKILL at epoch 3: nothing ran after the two epochs
    assert [json.loads(x)["epoch"] for x in log.read_text().splitlines()] == [0, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl"]  # under its own name, no temporary
