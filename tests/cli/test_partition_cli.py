import gzip
import sys

import numpy as np
import pytest

from haloflow.cli import main
from haloflow.partition.format import load_meta, load_new_to_orig, load_partition
from haloflow.partition.pipeline import read_input
from tests.data.test_planetoid import make_planetoid
from tests.partition.part_oracle import check_parts


def _snap(tmp_path, seed=0, n=60, m=240):
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    src[-1], dst[-1] = n - 1, 0  # make sure the largest id appears
    path = tmp_path / "g.txt"
    path.write_text("# test graph\n" + "".join(f"{s}\t{d}\n" for s, d in zip(src, dst)))
    return path


def test_partition_writes_folder_and_prints_table(tmp_path, capsys):
    path = _snap(tmp_path)
    out = tmp_path / "parts"
    assert main(["partition", str(path), "--parts", "3", "--method", "fennel", "--seed", "2", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    lines = stdout.splitlines()
    graph = read_input(path).graph  # symmetrised by default
    undirected = (graph.num_edges + graph.num_self_loops()) // 2
    # the estimate comes first, before the graph is read (issue 35): 240 lines of 60 nodes, read exactly
    assert lines[0].startswith("estimate before reading: peak memory about ") and "(241 edges, " in lines[0]
    assert lines[1].startswith(f"g: 60 nodes, {undirected} undirected edges ({graph.num_edges} directed entries)")
    assert lines[2].split() == ["part", "inner", "halo", "halo/inner", "edges"]
    assert [line.split()[0] for line in lines[4:8]] == ["0", "1", "2", "total"]
    assert "edge cut:" in stdout and "balance (largest / mean part): nodes" in stdout
    assert "wall time:" in stdout and "peak memory:" in stdout
    meta = load_meta(out)
    assert (meta.method, meta.seed, meta.num_parts) == ("fennel", 2, 3)
    assert meta.num_edges == graph.num_edges
    check_parts(graph, [load_partition(out, k) for k in range(3)], np.asarray(load_new_to_orig(out)))


def test_no_symmetrize_keeps_directed_edges(tmp_path, capsys):
    path = _snap(tmp_path, seed=1)
    out = tmp_path / "parts"
    argv = ["partition", path, "--parts", 2, "--method", "random", "--no-symmetrize", "--out", out]
    assert main([str(a) for a in argv]) == 0
    assert load_meta(out).num_edges == 240
    assert "60 nodes, 240 directed edges (read in" in capsys.readouterr().out
    assert main([str(a) for a in argv]) == 2  # exists now
    assert "already exists" in capsys.readouterr().err
    assert main([str(a) for a in argv + ["--overwrite", "--balance", "nodes,edges"]]) == 0
    assert load_meta(out).config["balance"] == ["nodes", "edges"]


def test_bad_input_one_line_and_nothing_written(cli_fails, tmp_path, capsys):
    out = tmp_path / "out"
    bad = tmp_path / "bad.txt"
    bad.write_text("0 1\n1 2\n2 x\n")
    cli_fails(["partition", bad, "--parts", 2, "--out", out], "bad.txt:3")
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing here\n")
    cli_fails(["partition", empty, "--parts", 2, "--out", out], "empty.txt", "empty graph")
    good = _snap(tmp_path)
    cli_fails(["partition", good, "--parts", 0, "--out", out], "--parts must be an integer >= 1, got 0")
    cli_fails(["partition", good, "--parts", 61, "--out", out], "--parts=61 exceeds the graph's 60 nodes")
    cli_fails(["partition", good, "--parts", 2, "--balance", "nodes,colour", "--out", out],
           "--balance: unknown weight 'colour'")
    cli_fails(["partition", tmp_path / "missing.txt", "--parts", 2, "--out", out], "missing.txt")
    assert not out.exists()
    out.mkdir()
    cli_fails(["partition", good, "--parts", 2, "--out", out], f"{out} already exists", "--overwrite")
    assert list(out.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "empty.txt", "g.txt", "out"]


def test_planetoid_cora_keeps_features_and_labels(tmp_path, capsys, shared_data):
    folder = shared_data / "planetoid"
    out = tmp_path / "cora"
    assert main(["partition", str(folder), "--parts", "2", "--balance", "nodes,train", "--out", str(out)]) == 0
    meta = load_meta(out)
    assert meta.num_nodes == 2708 and meta.num_edges == 10556 and meta.num_classes == 7
    assert set(meta.node_data) >= {"features", "labels", "train_mask"}
    dataset = read_input(folder)
    parts = [load_partition(out, k) for k in range(2)]
    check_parts(dataset.graph, parts, np.asarray(load_new_to_orig(out)), dataset)
    assert sum(int(p.train_mask.sum()) for p in parts) == 140


def test_reader_failures_are_one_line_and_nothing_written(cli_fails, tmp_path):
    out = tmp_path / "out"
    data = gzip.compress("".join(f"{i} {i + 1}\n" for i in range(20_000)).encode())
    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes(data[: len(data) // 2])
    cli_fails(["partition", cut, "--parts", 2, "--out", out], "cut.txt.gz: truncated or corrupt gzip data")
    garbage = tmp_path / "garbage.txt.gz"
    garbage.write_bytes(b"\x1f\x8b" + b"hello" * 20)
    cli_fails(["partition", garbage, "--parts", 2, "--out", out], "garbage.txt.gz: truncated or corrupt gzip data")
    huge = tmp_path / "huge.txt"
    huge.write_text("0 1\n1 9999999999\n")
    cli_fails(["partition", huge, "--parts", 2, "--out", out], "huge.txt:2: node id 9999999999 is out of range",
              "--num-nodes N")
    cli_fails(["partition", huge, "--parts", 2, "--num-nodes", 5, "--out", out], "huge.txt:2",
              "expected node ids in [0, 5)")
    cli_fails(["partition", huge, "--parts", 2, "--num-nodes", -1, "--out", out], "--num-nodes must be >= 0, got -1")
    pace = tmp_path / "g.gr"
    pace.write_text("p tw 3 2\n1 2\n2 3\n")
    cli_fails(["partition", pace, "--parts", 2, "--num-nodes", 5, "--out", out],
              "format 'pace' takes no option --num-nodes: expected none")
    note = tmp_path / "note.txt"
    note.write_text("not a folder")
    for target in (note / "parts", note / "a" / "b"):
        cli_fails(["partition", huge, "--parts", 2, "--out", target], f"cannot create {target}: {note} is a file")
    assert not out.exists() and note.read_text() == "not a folder"


def test_snap_header_weights_one_based_and_num_nodes(tmp_path, capsys):
    path = tmp_path / "konect.tsv"
    path.write_text("% sym weighted\nsrc\tdst\tweight\n1\t2\t0.5\n2\t3\t1\n3\t4\t2\n4\t1\t7\n")
    out = tmp_path / "parts"
    argv = ["partition", path, "--parts", 2, "--method", "random", "--one-based", "--out", out]
    assert main([str(a) for a in argv]) == 0
    assert capsys.readouterr().out.split("\n", 1)[1].startswith("konect: 4 nodes, 4 undirected edges (8 directed "
                                                                 "entries)")
    assert load_meta(out).num_nodes == 4
    assert main([str(a) for a in argv + ["--num-nodes", 6, "--overwrite"]]) == 0
    assert load_meta(out).num_nodes == 6


def test_planetoid_name_picks_one_of_several_sets(cli_fails, tmp_path, capsys):
    rng = np.random.default_rng(3)
    folder = tmp_path / "planetoid"
    make_planetoid(folder, rng, name="citeseer")
    make_planetoid(folder, rng, name="cora")
    out = tmp_path / "parts"
    cli_fails(["partition", folder, "--parts", 2, "--out", out], "holds Planetoid sets ['citeseer', 'cora']",
              "--name")
    cli_fails(["partition", folder, "--parts", 2, "--name", "pubmed", "--out", out], "no Planetoid set 'pubmed'")
    argv = ["partition", folder, "--parts", 2, "--method", "random", "--name", "cora", "--out", out]
    assert main([str(a) for a in argv]) == 0
    assert load_meta(out).name == "cora"


def test_an_edge_list_piped_into_dev_stdin_is_read(tmp_path):
    # `printf '0 1\n1 2\n' | haloflow partition /dev/stdin ...`: read once, as a stream (the reader used to look
    # at the first bytes, then open the pipe again and find it empty).
    import subprocess
    import sys

    for fmt in ([], ["--format", "snap"]):  # named or detected, the estimate must not sample the pipe
        out = tmp_path / f"parts{len(fmt)}"
        proc = subprocess.run([sys.executable, "-m", "haloflow", "partition", "/dev/stdin", "--parts", "2",
                               "--method", "random", *fmt, "--out", str(out)], input=b"0 1\n1 2\n",
                              capture_output=True, timeout=120)
        assert proc.returncode == 0, proc.stderr.decode()[-2000:]
        estimate, rest = proc.stdout.decode().split("\n", 1)
        assert estimate.startswith("estimate before reading: unknown")  # a pipe is read once: never sampled first
        assert rest.startswith("stdin: 3 nodes, 2 undirected edges")
    assert load_meta(out).num_nodes == 3


def test_matrix_market_and_skip_lines_through_the_cli(cli_fails, tmp_path, capsys):
    import scipy.io
    import scipy.sparse as sp

    mtx = tmp_path / "m.mtx"
    scipy.io.mmwrite(mtx, sp.random(50, 50, density=0.1, random_state=1, format="coo"))
    out = tmp_path / "parts"
    assert main(["partition", str(mtx), "--parts", "2", "--method", "random", "--out", str(out)]) == 0
    assert load_meta(out).num_nodes == 50  # not 51: the size line "50 50 250" is no edge
    jlg = tmp_path / "path.jlg"
    jlg.write_text("4,3,u,graph,Int64,simplegraph\n1,2\n2,3\n3,4\n")
    cli_fails(["partition", jlg, "--parts", 2, "--out", tmp_path / "j"], "path.jlg:1: expected 2 to 4 fields",
              "if line 1 is a header, pass skip_lines=1 (--skip-lines 1)")
    assert main(["partition", str(jlg), "--parts", "2", "--method", "random", "--skip-lines", "1", "--one-based",
                 "--out", str(tmp_path / "j")]) == 0
    assert load_meta(tmp_path / "j").num_nodes == 4
    cli_fails(["partition", mtx, "--parts", 2, "--skip-lines", 1, "--out", tmp_path / "k"],
              "format 'mtx' takes no option --skip-lines: expected none")


def test_partition_never_imports_torch(tmp_path):
    """`haloflow partition` builds only its own parser: the trainers' parsers would import torch (~230 MiB RSS)."""
    import subprocess
    import sys

    path, out = _snap(tmp_path), tmp_path / "parts"
    code = ("import sys; from haloflow.cli import main; "
            f"status = main(['partition', {str(path)!r}, '--parts', '2', '--out', {str(out)!r}]); "
            "print(status, 'torch' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split()[-2:] == ["0", "False"], run.stdout + run.stderr
    assert (out / "meta.json").is_file()
    # the control: the check does see torch where it is imported (the trainers' parsers no longer import it:
    # tests/cli/test_runtime_args.py)
    code = "import sys; import haloflow.engine.runtime; print('torch' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.split()[-1] == "True"


@pytest.mark.parametrize("package", ["kahip", "mtkahypar", "kaminpar"])
def test_a_missing_optional_library_is_one_line_naming_it_and_exit_2(cli_fails, tmp_path, monkeypatch, package):
    """Issue 35, acceptance 4: the user learns what to install, and nothing is written."""
    monkeypatch.setitem(sys.modules, package, None)  # `import package` now raises ImportError, as if not installed
    out = tmp_path / "parts"
    cli_fails(["partition", _snap(tmp_path), "--parts", "2", "--method", package, "--out", out],
              f"method '{package}' needs the {package} package, which is not installed: pip install "
              f"{package}")
    assert not out.exists()


def test_auto_without_the_libraries_is_metis(tmp_path, monkeypatch, capsys):
    for package in ("kahip", "mtkahypar", "kaminpar"):
        monkeypatch.setitem(sys.modules, package, None)
    path = _snap(tmp_path)
    for method in ("auto", "metis"):
        assert main(["partition", str(path), "--parts", "3", "--method", method, "--out", str(tmp_path / method)]) == 0
    assert np.array_equal(load_new_to_orig(tmp_path / "auto"), load_new_to_orig(tmp_path / "metis"))
