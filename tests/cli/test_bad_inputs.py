"""Issue 10's bad-input list, case by case: each is a clean one-line error (exit 2, nothing half-written), or, for
the formats users hold, read correctly. Cases already tested beside their command are named here, not repeated:

16 tracebacks
    truncated .gz edge list, garbage behind a gzip magic number, node id 9,999,999,999, --out under a file
        test_partition_cli.py::test_reader_failures_are_one_line_and_nothing_written
    truncated .xz edge list, node id 5,000,000 on a small graph, --save under a file      here
    empty / truncated / binary Criteo file
        test_preprocess_cli.py::test_inputs_that_are_not_criteo_are_one_line_and_nothing_written
    truncated train.parquet; table_sizes edited smaller (1 process here, 2 ranks in the slow test)      here
    --hidden 1000000000; a partition folder whose labels, num_classes or bounds were edited      here
15 clean rank messages buried under torchrun's output
    a rank's mistake repeated last with its rank, exit 2
        test_train_dlrm.py::test_a_mistake_found_by_the_ranks_ends_in_one_line_naming_the_rank_and_exit_2
    --nproc that does not match the folder's parts, before torchrun starts
        test_train_cli.py::test_user_errors_are_one_line ("has 2 parts but 3 processes run")
1 hang: plan-tables --world-size 1000000      here
13 silent successes
    preprocess criteo dropping 100 % of the rows (a graph file; a CSV of something else)
        test_preprocess_cli.py::test_inputs_that_are_not_criteo...; the CSV here
    val_auc NaN in the JSON lines      test_train_dlrm.py::test_people_get_a_table_and_programs_get_json_lines
    training on an empty data set, --max-eval-batches 0      here
    inspect passing an edited dtype, bounds or class count      here
    the same input file given twice      test_preprocess_cli.py::test_inputs_that_are_not_criteo... (and here)
    --memory-per-rank 1e400      here
Formats users hold
    header line, third column, 1-based ids      test_partition_cli.py::test_snap_header_weights_one_based_and_num_nodes
    Criteo CSV with a header      tests/data/test_criteo.py::test_csv_with_a_header_reads_like_the_tsv
    Planetoid --name      test_partition_cli.py::test_planetoid_name_picks_one_of_several_sets
"""

import json
import lzma
import shutil

import numpy as np
import pytest

from haloflow.cli import main
from haloflow.data.clicks import ClickLogConfig, ClickLogGenerator
from haloflow.partition.api import PartitionConfig
from haloflow.partition.pipeline import partition_dataset
from haloflow.utils.checksum import crc32_file
from tests.engine.scripts.common import small_dataset


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Partition folders of a labelled graph with 1 and 2 parts (120 nodes, 3 classes)."""
    root = tmp_path_factory.mktemp("bad_inputs")
    dataset = small_dataset(num_nodes=120, num_edges=500, feat_dim=8, num_classes=3, seed=4)
    for k in (1, 2):
        partition_dataset(dataset, PartitionConfig(num_parts=k, method="random"), root / f"k{k}", progress=False)
    return root


@pytest.fixture(scope="module")
def clicks(tmp_path_factory):
    """A small preprocessed click folder (26 tables of at most 50 rows)."""
    out = tmp_path_factory.mktemp("clicks") / "c"
    ClickLogGenerator(ClickLogConfig(scale=1e-4, max_rows=50)).write_parquet(
        out, {"train": 256, "val": 64, "test": 64}, row_group_size=64)
    return out


def _edited(folders, tmp_path, k: int, edit) -> str:
    """A copy of the k-part folder with ``edit(folder, meta)`` applied and meta.json rewritten."""
    out = tmp_path / f"edited-{k}"
    shutil.copytree(folders / f"k{k}", out)
    meta = json.loads((out / "meta.json").read_text())
    edit(out, meta)
    (out / "meta.json").write_text(json.dumps(meta))
    return str(out)


def _rewrite(folder, meta, rel: str, arr: np.ndarray) -> None:
    """Replace one array and record it in meta as the writer would (size, dtype, shape and CRC all agree)."""
    np.save(folder / rel, arr)
    meta["files"][rel].update(size=(folder / rel).stat().st_size, dtype=arr.dtype.str, shape=list(arr.shape),
                              crc32=crc32_file(folder / rel))


# ------------------------------------------------------------------------------------------- tracebacks
def test_truncated_xz_and_an_id_far_beyond_the_edges(cli_fails, tmp_path):
    out = tmp_path / "out"
    data = lzma.compress("".join(f"{i} {i + 1}\n" for i in range(20_000)).encode())
    cut = tmp_path / "cut.txt.xz"
    cut.write_bytes(data[: len(data) // 2])
    cli_fails(["partition", cut, "--parts", 2, "--out", out], "cut.txt.xz: truncated or corrupt xz data")
    five = tmp_path / "five.txt"
    five.write_text("0 1\n1 2\n2 5000000\n")  # would silently build a 5 M-node graph
    cli_fails(["partition", five, "--parts", 2, "--out", out], "five.txt:3: node id 5000000 is out of range",
              "--num-nodes N")
    assert not out.exists()


def test_save_and_log_under_a_file_fail_before_training(cli_fails, folders, tmp_path):
    note = tmp_path / "note.txt"
    note.write_text("keep")
    for flag in ("--save", "--log-jsonl"):
        cli_fails(["train", "gcn", "--partitions", folders / "k1", "--epochs", 1, flag, note / "x", "--no-progress"],
                  f"cannot create {note / 'x'}: {note} is a file", f"choose another {flag}")
    cli_fails(["train", "dlrm", "--synthetic", "--log-jsonl", note / "x"], f"{note} is a file")
    assert note.read_text() == "keep"


def test_truncated_parquet_is_one_line(cli_fails, clicks, tmp_path):
    cut = tmp_path / "cut"
    shutil.copytree(clicks, cut)
    data = (cut / "train.parquet").read_bytes()
    (cut / "train.parquet").write_bytes(data[: len(data) // 2])
    cli_fails(["train", "dlrm", "--data", cut, "--max-steps", 2, "--no-progress"],
              "train.parquet is truncated or altered: ", f"expected {len(data)}")
    meta = json.loads((cut / "metadata.json").read_text())  # a folder written before sizes were recorded
    del meta["files"]
    (cut / "metadata.json").write_text(json.dumps(meta))
    cli_fails(["train", "dlrm", "--data", cut, "--max-steps", 2, "--no-progress"],
              "train.parquet: not a readable Parquet file, truncated or corrupt")


def _smaller_tables(clicks, tmp_path):
    small = tmp_path / "small"
    shutil.copytree(clicks, small)
    meta = json.loads((small / "metadata.json").read_text())
    meta["table_sizes"] = [2] * len(meta["table_sizes"])
    (small / "metadata.json").write_text(json.dumps(meta))
    return small


def test_table_sizes_edited_smaller_is_checked_by_the_loader(cli_fails, clicks, tmp_path):
    small = _smaller_tables(clicks, tmp_path)
    cli_fails(["train", "dlrm", "--data", small, "--max-steps", 2, "--no-progress"],
              "train.parquet: row group 0, column C", "but metadata.json's table_sizes[", "expected ids in [0, 2)")


@pytest.mark.slow
def test_table_sizes_edited_smaller_gives_the_same_line_on_two_ranks(clicks, tmp_path):
    import subprocess
    import sys

    from tests.conftest import REPO

    small = _smaller_tables(clicks, tmp_path)
    proc = subprocess.run([sys.executable, "-m", "haloflow", "train", "dlrm", "--data", str(small), "--nproc", "2",
                           "--max-steps", "2", "--no-progress"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("haloflow train: error: rank ") and "of 2: " in last, last
    assert "train.parquet: row group 0, column C" in last and "expected ids in [0, 2)" in last, last


def test_hidden_too_wide_for_memory_is_one_line(cli_fails, folders):
    cli_fails(["train", "gcn", "--partitions", folders / "k1", "--hidden", 1_000_000_000, "--epochs", 1,
               "--no-progress"], "hidden_dim 1000000000 (--hidden)", "needs at least", "TiB to train")


def _edit_labels(folder, meta):
    labels = np.load(folder / "part-0/labels.npy")
    labels[0] = 7
    _rewrite(folder, meta, "part-0/labels.npy", labels)


def _shift_bounds(folder, meta):
    meta["bounds"][1] -= 1


def _own_halo(folder, meta):  # part 0's halo names node 0, which part 0 owns
    _rewrite(folder, meta, "part-0/halo_gids.npy", np.load(folder / "part-0/halo_gids.npy") * 0)


@pytest.mark.parametrize("k, edit, message", [
    (1, _edit_labels, "part-0/labels.npy: labels[0] = 7 is out of range: expected class ids"),
    (1, lambda folder, meta: meta.update(num_classes=1), "(meta.json: num_classes = 1; -1 = unlabelled) in [-1, 1)"),
    (2, lambda folder, meta: meta.update(bounds=[0, 130, 120]), "meta.json: bounds must not decrease"),
    (1, lambda folder, meta: meta["files"]["part-0/labels.npy"].update(dtype="<i4"),
     "meta.json records dtype <i4 for part-0/labels.npy, expected <i8"),
    (2, _shift_bounds, "part-0/indptr.npy: {n} entries, but meta.json's bounds give part 0 {m} nodes"),
    (2, _own_halo, "part-0/halo_gids.npy: halo_gids[0] = 0 is owned by part 0"),
])
def test_an_edited_partition_folder_fails_inspect_and_training_alike(cli_fails, folders, tmp_path, k, edit, message):
    """Every edit keeps sizes and CRC-32s consistent, so only the meaning checks can see it; training (which
    loads part 0 in one process) stops with the same line where it gets that far."""
    folder = _edited(folders, tmp_path, k, edit)
    bound = json.loads((folders / "k2" / "meta.json").read_text())["bounds"][1]
    message = message.format(n=bound + 1, m=bound - 1)
    cli_fails(["inspect", folder], message)
    if edit not in (_shift_bounds, _own_halo):  # those need 2 processes to reach part 0
        cli_fails(["train", "gcn", "--partitions", folder, "--epochs", 1, "--no-progress"], message)


def test_inspect_says_what_it_checked(folders, capsys):
    assert main(["inspect", str(folders / "k2")]) == 0
    assert capsys.readouterr().out.rstrip().endswith("sizes, CRC-32 and contents checked")


# ------------------------------------------------------------------------------------------- the hang
def test_plan_tables_world_size_is_bounded(cli_fails):
    cli_fails(["plan-tables", "--tables", "kaggle", "--world-size", 1_000_000, "--memory-per-rank", "1GiB"],
              "--world-size must be <= 16,384, got 1,000,000")


# ------------------------------------------------------------------------------------------- silent successes
@pytest.mark.parametrize("memory", ["1e400", "1e308TiB", "1GiB,1e400"])
def test_memory_per_rank_must_be_finite(cli_fails, memory):
    cli_fails(["plan-tables", "--tables", "kaggle", "--world-size", 2, f"--memory-per-rank={memory}"],
              "--memory-per-rank: '1e", "expected a finite number of bytes")


def test_nothing_to_evaluate_or_train_on_is_an_error(cli_fails, clicks, tmp_path):
    cli_fails(["train", "dlrm", "--data", clicks, "--max-eval-batches", 0, "--no-progress"],
              "--max-eval-batches: max_eval_batches must be >= 1")
    empty = tmp_path / "empty"
    ClickLogGenerator(ClickLogConfig(scale=1e-4, max_rows=50)).write_parquet(
        empty, {"train": 0, "val": 64, "test": 64}, row_group_size=64)
    cli_fails(["train", "dlrm", "--data", empty, "--no-progress"], "the train split has no rows: nothing to train on")


def test_a_csv_of_something_else_is_not_an_empty_data_set(cli_fails, tmp_path):
    other = tmp_path / "other.csv"
    other.write_text("a,b,c\n1,2,3\n4,5,6\n")
    cli_fails(["preprocess", "criteo", other, "--out", tmp_path / "o", "--max-ind-range", 9],
              "other.csv: all 2 lines were rejected", "a header line")
    same = tmp_path / "same.txt"
    same.write_text("0\t1\n")
    cli_fails(["preprocess", "criteo", same, tmp_path / "." / "same.txt", "--out", tmp_path / "o"], "is given twice")
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------------- found by the sweep
def test_binary_plan_and_table_files_are_one_line(cli_fails, tmp_path):
    blob = bytes([0x80, 0xFB]) + bytes(range(256))
    for name in ("tables.json", "tables.csv"):
        (tmp_path / name).write_bytes(blob)
        cli_fails(["plan-tables", "--tables", tmp_path / name, "--world-size", 2, "--memory-per-rank", "1GiB"],
                  f"{name}: not text")
    (tmp_path / "plan.json").write_bytes(blob)
    cli_fails(["train", "dlrm", "--synthetic", "--plan", tmp_path / "plan.json", "--max-steps", 1, "--no-progress"],
              "plan.json: not text")


@pytest.mark.parametrize("argv, message", [
    (["partition", "{g}", "--parts", 2, "--imbalance", "inf", "--out", "{tmp}/o"], "--imbalance must be a finite"),
    (["train", "gcn", "--partitions", "{k1}", "--layers", 1_000_000],
     "--layers: num_layers must be <= 1,024, got 1,000,000"),
    (["train", "gcn", "--partitions", "{k1}", "--save", "{tmp}/x", "--log-jsonl", "{tmp}/./x"],
     "(--save, --log-jsonl) both name"),
    (["preprocess", "clicks", "--out", "{tmp}/o", "--multi-hot", "inf"], "multi_hot must be in [1, 1024]"),
    (["preprocess", "clicks", "--out", "{tmp}/o", "--scale", "inf"], "scale must be a finite number > 0"),
    (["preprocess", "clicks", "--out", "{tmp}/o", "--seed", -1], "seed must be >= 0"),
    (["preprocess", "clicks", "--out", "{tmp}/o", "--scale", "1e12"], "for their id counts, but this machine has"),
])
def test_flags_the_cli_sweep_broke(cli_fails, folders, tmp_path, argv, message):
    g = tmp_path / "g.txt"
    g.write_text("0 1\n1 2\n2 3\n3 0\n")
    cli_fails([str(a).format(g=g, tmp=tmp_path, k1=folders / "k1") for a in argv], message)
    assert not (tmp_path / "o").exists() and not (tmp_path / "x").exists()
