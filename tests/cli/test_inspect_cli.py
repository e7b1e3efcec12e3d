import json

import pytest

from haloflow.cli import main
from haloflow.partition.api import PartitionConfig
from haloflow.partition.pipeline import partition_dataset
from tests.partition.part_oracle import small_dataset


@pytest.fixture
def folder(tmp_path):
    out = tmp_path / "parts"
    summary = partition_dataset(small_dataset(seed=31), PartitionConfig(num_parts=3, method="random"), out,
                                progress=False)
    return out, summary


def test_inspect_prints_meta_and_table(folder, capsys):
    out, summary = folder
    assert main(["inspect", str(out)]) == 0
    stdout = capsys.readouterr().out
    lines = stdout.splitlines()
    assert "format_version 1" in lines[0] and "'small'" in lines[0]
    edges = f"{summary.meta.num_edges:,} directed edge entries"
    assert lines[1].startswith(f"200 nodes, {edges}, 3 parts by random (seed 0")
    assert lines[2] == "node data: features, labels, train_mask, val_mask, test_mask; classes: 4"
    assert lines[3].split() == ["part", "inner", "halo", "halo/inner", "edges", "train"]
    for k in range(3):
        assert lines[5 + k].split()[:3] == [str(k), str(summary.stats.inner[k]), str(summary.stats.halo[k])]
    assert f"edge cut: {summary.stats.edge_cut:.2%}" in stdout
    assert stdout.rstrip().endswith("sizes, CRC-32 and contents checked")


def test_inspect_errors(cli_fails, folder, tmp_path, capsys):
    out, _ = folder
    cli_fails(["inspect", tmp_path / "nowhere"], "partition folder", "nowhere does not exist")
    target = out / "part-2" / "features.npy"
    data = target.read_bytes()
    target.write_bytes(data[: len(data) // 2])
    cli_fails(["inspect", out, "--no-verify"], "part-2/features.npy is truncated or altered",
           f"{len(data) // 2} bytes, expected {len(data)}")
    target.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert main(["inspect", str(out), "--no-verify"]) == 0
    assert "checksums skipped (--no-verify)" in capsys.readouterr().out
    cli_fails(["inspect", out], "part-2/features.npy is corrupt: CRC-32")
    meta = json.loads((out / "meta.json").read_text())
    meta["format_version"] = 0
    (out / "meta.json").write_text(json.dumps(meta))
    cli_fails(["inspect", out], "meta.json: format_version is 0, expected 1")
