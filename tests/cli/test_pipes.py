"""`haloflow ... | head -1`: a reader that leaves early ends every command quietly, with the status of SIGPIPE."""

import io
import signal
import subprocess
import sys

from haloflow.cli import main

SIGPIPE_STATUS = 128 + signal.SIGPIPE  # 141: what the shell reports for `yes | head -1`


def test_a_closed_pipe_ends_the_command_quietly_with_141():
    # The reader is gone before anything is written (it used to end in a BrokenPipeError traceback, status 1; the
    # interpreter's own flush at exit meets the broken pipe too, with "Exception ignored ...").
    proc = subprocess.Popen([sys.executable, "-m", "haloflow", "bench"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == SIGPIPE_STATUS
    assert err == ""


class _ClosedPipe(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


def test_a_write_into_a_closed_pipe_inside_a_command_is_no_traceback(monkeypatch):
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(["plan-tables", "--tables", "kaggle", "--world-size", "4", "--memory-per-rank", "1GiB"]) \
        == SIGPIPE_STATUS
