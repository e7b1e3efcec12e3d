"""`haloflow partition --memory-budget`: the out-of-core path from the command line."""

import hashlib
import os
import signal
import subprocess
import sys
import time


from haloflow.cli import main
from haloflow.data.generators import sbm_dataset
from haloflow.data.graph_folder import write_graph_folder


def _digest(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _folder(tmp_path, n=2000):
    return write_graph_folder(tmp_path / "sbm", sbm_dataset(num_nodes=n, seed=1))


def test_out_of_core_folder_equals_the_in_memory_one(tmp_path, capsys):
    folder = _folder(tmp_path)
    common = ["partition", folder, "--parts", "3", "--method", "fennel", "--passes", "2", "--seed", "5"]
    assert main([str(a) for a in common + ["--memory-budget", "4GiB", "--tmp-dir", tmp_path / "tmp",
                                           "--out", tmp_path / "ooc"]]) == 0
    out = capsys.readouterr().out
    assert out.split("\n", 1)[1].startswith("sbm: 2,000 nodes, ") and "out of core" in out and "memory budget: 4.0 GiB" in out
    assert "temporary files:" in out and list((tmp_path / "tmp").iterdir()) == []
    assert main([str(a) for a in common + ["--fennel-start", "stream", "--fennel-order", "natural",
                                           "--out", tmp_path / "mem"]]) == 0
    assert _digest(tmp_path / "ooc") == _digest(tmp_path / "mem")
    assert main(["inspect", str(tmp_path / "ooc")]) == 0


def test_budget_too_small_fails_at_once_with_one_line(tmp_path, cli_fails):
    folder = _folder(tmp_path)
    cli_fails(["partition", folder, "--parts", "2", "--method", "random", "--memory-budget", "1MiB",
               "--out", tmp_path / "out"],
              "--memory-budget 1.0 MiB cannot hold this graph: its 2,000 nodes need 25 bytes per node",
              "expected --memory-budget >=")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sbm"]


def test_a_budget_below_the_process_itself_says_so_before_reading(tmp_path, cli_fails):
    (tmp_path / "g.txt").write_text("0 1\n1 2\n2 0\n")  # a text list: its node count is unknown until read
    cli_fails(["partition", tmp_path / "g.txt", "--parts", "2", "--method", "fennel", "--memory-budget", "1KiB",
               "--out", tmp_path / "out"],
              "--memory-budget 1.0 KiB is below what this process holds before reading the graph (",
              "expected --memory-budget >=")
    assert not (tmp_path / "out").exists()


def test_a_pipe_is_refused_up_front(tmp_path):
    """The passes read the input more than once; a pipe would be read empty the second time ("empty graph")."""
    run = subprocess.run([sys.executable, "-m", "haloflow", "partition", "/dev/stdin", "--parts", "2", "--method",
                          "fennel", "--memory-budget", "4GiB", "--out", str(tmp_path / "out")],
                         input="0 1\n1 2\n2 0\n", capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().endswith("/dev/stdin is a pipe or device, and --memory-budget reads its input once per "
                                       "pass: expected a file or folder (save the stream to a file first, or drop "
                                       "--memory-budget)")
    assert not (tmp_path / "out").exists()
    # the control: the same lines from a file partition
    (tmp_path / "g.txt").write_text("0 1\n1 2\n2 0\n")
    assert main(["partition", str(tmp_path / "g.txt"), "--parts", "2", "--method", "fennel", "--memory-budget",
                 "4GiB", "--out", str(tmp_path / "out")]) == 0


def test_flag_errors(tmp_path, cli_fails):
    folder = _folder(tmp_path, n=100)
    base = ["partition", folder, "--parts", "2", "--out", tmp_path / "out"]
    cli_fails(base + ["--memory-budget", "lots"], "--memory-budget: expected a size such as 2GiB")
    cli_fails(base + ["--method", "metis", "--memory-budget", "4GiB"], "method 'metis' needs it whole in memory")
    cli_fails(base + ["--method", "fennel", "--fennel-start", "bisect", "--memory-budget", "4GiB"],
              "--fennel-start='bisect' needs the whole graph in memory")
    cli_fails(base + ["--tmp-dir", tmp_path], "--tmp-dir is where --memory-budget puts its temporary files")
    cli_fails(base + ["--method", "fennel", "--passes", "0"], "--passes must be an integer in 1..1000, got 0")
    cli_fails(base + ["--passes", "2"], "--passes applies only to --method fennel (this run is --method metis)")
    (tmp_path / "g.mtx").write_text("%%MatrixMarket matrix coordinate pattern general\n2 2 1\n1 2\n")
    cli_fails(["partition", tmp_path / "g.mtx", "--parts", "2", "--method", "fennel", "--memory-budget", "4GiB",
               "--out", tmp_path / "out"], "format 'mtx' is read whole, not in chunks")
    assert not (tmp_path / "out").exists()


def test_interrupted_run_leaves_neither_out_nor_temporary_files(tmp_path):
    # A graph big enough, and passes enough, that the run is still going when the signal comes.
    folder = write_graph_folder(tmp_path / "big", sbm_dataset(num_nodes=400_000, avg_degree=20, seed=2))
    work = tmp_path / "work"
    work.mkdir()
    for sig in (signal.SIGINT, signal.SIGTERM):
        proc = subprocess.Popen([sys.executable, "-m", "haloflow", "partition", str(folder), "--parts", "8",
                                 "--method", "fennel", "--passes", "50", "--memory-budget", "8GiB", "--tmp-dir",
                                 str(work), "--out", str(tmp_path / "out")], stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": os.getcwd()},
                                # as a shell's `cmd &` starts it: SIGINT ignored, so no Python Ctrl-C handler
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        deadline = time.monotonic() + 120
        while not any(work.iterdir()) and time.monotonic() < deadline:  # polled: the scratch folder means the run
            time.sleep(0.05)                                             # is inside its cleanup scope
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err
        assert "interrupted" in err
        assert list(work.iterdir()) == [] and not (tmp_path / "out").exists()
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]
