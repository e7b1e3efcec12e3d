"""``haloflow predict`` and ``haloflow export`` on a user's mistakes: one line on stderr, exit 2, no traceback,
and no output file left behind. The models are tiny runs of each family in this process."""

from pathlib import Path

import pytest

from haloflow.engine.run_config import CheckpointConfig, RuntimeConfig
from haloflow.partition.api import PartitionConfig
from haloflow.partition.pipeline import partition_dataset
from tests.engine.scripts.common import small_dataset

SYNTH = dict(synthetic=True, synthetic_max_rows=50, synthetic_train=256, synthetic_val=64)
SYNTH_FLAGS = ["--synthetic", "--synthetic-max-rows", "50", "--synthetic-train", "256", "--synthetic-val", "64"]


def write_stream(path: Path, ev, *, bump_last_src: int | None = None) -> Path:
    src = ev.src.copy()
    if bump_last_src is not None:
        src[-1] = bump_last_src
    lines = ["u,i,ts,label,f0,f1,f2"] + [f"{u},{v},{t},0,{','.join(f'{x:.6f}' for x in f)}"
                                         for u, v, t, f in zip(src, ev.dst, ev.t, ev.edge_feat)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """A checkpoint dir of each family (K = 1), the GCN's partition folder and the TGN's stream."""
    from haloflow.engine.dlrm.config import DLRMTrainConfig
    from haloflow.engine.dlrm.train import train_dlrm
    from haloflow.engine.gcn.config import GCNTrainConfig
    from haloflow.engine.gcn.train import train_gcn
    from haloflow.engine.tgn.config import TGNTrainConfig
    from haloflow.engine.tgn.train import train_tgn
    from tests.engine.scripts.tgn_parity import stream

    root = tmp_path_factory.mktemp("models")

    def runtime(name: str) -> RuntimeConfig:
        return RuntimeConfig(progress=False, log_every=1000, checkpoint=CheckpointConfig(dir=root / name))

    partition_dataset(small_dataset(num_nodes=80, num_edges=300, feat_dim=6, seed=2),
                      PartitionConfig(num_parts=1, method="random", seed=1), root / "parts", progress=False)
    partition_dataset(small_dataset(num_nodes=80, num_edges=300, feat_dim=5, seed=2),
                      PartitionConfig(num_parts=1, method="random", seed=1), root / "parts5", progress=False)
    train_gcn(GCNTrainConfig(partitions=str(root / "parts"), epochs=2, hidden_dim=4, runtime=runtime("gcn")))
    train_dlrm(DLRMTrainConfig(**SYNTH, batch_size=32, embedding_dim=4, bottom_mlp=(8,), top_mlp=(8,), max_steps=3,
                               max_eval_batches=1, runtime=runtime("dlrm")))
    ev = stream(num_events=600)
    write_stream(root / "events.csv", ev)
    write_stream(root / "unknown.csv", ev, bump_last_src=int(ev.num_nodes) + 50)
    train_tgn(TGNTrainConfig(events=root / "events.csv", batch_size=64, memory_dim=8, time_dim=4, embedding_dim=8,
                             num_neighbors=3, max_train_batches=2, eval=False, runtime=runtime("tgn")))
    return {"root": root, "gcn": root / "gcn", "dlrm": root / "dlrm", "tgn": root / "tgn", "parts": root / "parts",
            "parts5": root / "parts5", "events": root / "events.csv", "unknown": root / "unknown.csv"}


def test_a_model_of_another_family(cli_fails, models, tmp_path):
    out = tmp_path / "o.csv"
    cli_fails(["predict", "gcn", "--model", models["dlrm"], "--partitions", models["parts"], "--out", out],
              "a DLRM model, but this is `predict gcn`")
    cli_fails(["predict", "dlrm", "--model", models["tgn"], *SYNTH_FLAGS, "--out", out],
              "a TGN model, but this is `predict dlrm`")
    cli_fails(["predict", "tgn", "--model", models["gcn"], "--events", models["events"], "--out", out],
              "a GCN model, but this is `predict tgn`")
    assert not out.exists()


def test_a_graph_of_another_feature_width(cli_fails, models, tmp_path):
    cli_fails(["predict", "gcn", "--model", models["gcn"], "--partitions", models["parts5"], "--out",
               tmp_path / "o.parquet"], "5 features per node", "trained on 6")
    assert not (tmp_path / "o.parquet").exists()


def test_click_data_with_other_table_sizes(cli_fails, models, tmp_path):
    flags = [f if f != "50" else "40" for f in SYNTH_FLAGS]
    cli_fails(["predict", "dlrm", "--model", models["dlrm"], *flags, "--out", tmp_path / "o.csv"],
              "has 40 rows, but the model", "with 50 rows there")
    assert not (tmp_path / "o.csv").exists()


def test_an_event_stream_with_unknown_nodes(cli_fails, models, tmp_path):
    cli_fails(["predict", "tgn", "--model", models["tgn"], "--events", models["unknown"], "--out",
               tmp_path / "o.csv"], "node ids the model", "has no memory for")
    assert not (tmp_path / "o.csv").exists()


def test_missing_files(cli_fails, models, tmp_path):
    out = tmp_path / "o.csv"
    cli_fails(["predict", "gcn", "--model", tmp_path / "nope.pt", "--partitions", models["parts"], "--out", out],
              "nope.pt does not exist")
    cli_fails(["predict", "gcn", "--model", models["gcn"], "--partitions", tmp_path / "nothing", "--out", out],
              "nothing does not exist")
    cli_fails(["predict", "dlrm", "--model", models["dlrm"], "--data", tmp_path / "nodata", "--out", out],
              "nodata does not exist")
    cli_fails(["predict", "tgn", "--model", models["tgn"], "--events", tmp_path / "none.csv", "--out", out],
              "none.csv does not exist")
    cli_fails(["export", tmp_path / "gone", "--out", tmp_path / "m.pt"], "gone does not exist")
    assert not out.exists() and not (tmp_path / "m.pt").exists()


def test_files_that_are_not_models(cli_fails, models, tmp_path):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a model")
    cli_fails(["predict", "gcn", "--model", junk, "--partitions", models["parts"], "--out", tmp_path / "o.csv"],
              "not a haloflow model")
    cli_fails(["export", models["parts"], "--out", tmp_path / "m.pt"], "holds no checkpoint")
    cli_fails(["predict", "gcn", "--model", models["gcn"], "--partitions", models["parts"], "--out",
               tmp_path / "o.txt"], "expected a .parquet (or .pq) or .csv file name")
    assert not (tmp_path / "m.pt").exists()


def test_export_will_not_overwrite_without_being_asked(cli_fails, models, tmp_path):
    from haloflow.cli import main

    assert main(["export", str(models["gcn"]), "--out", str(tmp_path / "m.pt")]) == 0
    cli_fails(["export", models["gcn"], "--out", tmp_path / "m.pt"], "already exists; pass --overwrite")


def test_embeddings_of_each_family(models, tmp_path):
    """--embeddings: the GCN's hidden layer per node, a DLRM table's rows (those the checkpoint holds, exactly),
    the TGN memory per node."""
    import pyarrow.csv as pcsv
    import torch

    from haloflow.cli import main
    from haloflow.engine.checkpoint import open_checkpoint

    assert main(["predict", "gcn", "--model", str(models["gcn"]), "--partitions", str(models["parts"]), "--out",
                 str(tmp_path / "g.csv"), "--embeddings", str(tmp_path / "ge.csv")]) == 0
    g = pcsv.read_csv(tmp_path / "ge.csv")
    assert g.num_rows == 80 and g.column_names == ["node_id"] + [f"h_{j}" for j in range(4)]
    assert min(min(g[f"h_{j}"].to_pylist()) for j in range(4)) >= 0  # after the relu the last layer reads
    assert main(["predict", "dlrm", "--model", str(models["dlrm"]), *SYNTH_FLAGS, "--out", str(tmp_path / "d.csv"),
                 "--embeddings", str(tmp_path / "de.csv"), "--table", "3"]) == 0
    d = pcsv.read_csv(tmp_path / "de.csv")
    ck = open_checkpoint(models["dlrm"])
    n = ck.manifest["identity"]["table_sizes"][3]
    want = ck.rows(3, (0, n), (0, 4), "weight")
    got = torch.tensor([d[f"e_{j}"].to_pylist() for j in range(4)], dtype=torch.float32).T
    assert d.num_rows == n and torch.equal(got, want)
    assert main(["predict", "tgn", "--model", str(models["tgn"]), "--events", str(models["events"]), "--out",
                 str(tmp_path / "t.csv"), "--embeddings", str(tmp_path / "te.csv")]) == 0
    t = pcsv.read_csv(tmp_path / "te.csv")
    assert t.column_names == ["node_id"] + [f"m_{j}" for j in range(8)]
    assert t.num_rows == open_checkpoint(models["tgn"]).manifest["identity"]["nodes"]
