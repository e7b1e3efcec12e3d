"""A peer library in a Python of its own, driven from a benchmark's process line by line.

DGL's wheels stop at torch 2.2 and TorchRec's CPU kernels need their own torch build, so neither imports beside
haloflow's torch. ``scripts/setup_peers.sh`` builds each in a virtual environment of its own; a benchmark starts
the peer's worker script under that Python once, hands it the same data through files, and then asks it for one
timed unit of work at a time, in turn with its own contestants, so that both sides see the same machine load:

    benchmark process                              peer process (PEER_PYTHON haloflow/bench/peers/NAME.py)
    -----------------                              ------------
    PeerProcess(python, "NAME", setup={...})  -->  {"setup": {...}}             builds model, loads data
                                              <--  {"ready": true, "info": {...}}
    peer.call("epoch")                        -->  {"cmd": "epoch"}
                                              <--  {"seconds": 0.71, "loss": 3.69}
    ...
    peer.close()                              -->  {"cmd": "exit"}

One JSON object a line each way; the peer's stderr passes through to ours; a reply ``{"error": "..."}`` or a dead
peer raises ``PeerError`` with the peer's message. The peer scripts import nothing from haloflow: they run under
another torch.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

__all__ = ["PeerError", "PeerProcess", "default_peer_python", "peer_python_flag", "PEERS_DIR_ENV"]

PEERS_DIR_ENV = "HALOFLOW_PEERS"  # where scripts/setup_peers.sh builds the peers' virtual environments
_SCRIPTS = Path(__file__).with_name("peers")


class PeerError(RuntimeError):
    """The peer process failed: its own message, or how it ended."""


def peers_dir() -> Path:
    return Path(os.environ.get(PEERS_DIR_ENV) or Path.home() / ".cache" / "haloflow-peers")


def default_peer_python(name: str) -> Path | None:
    """The Python of peer ``name`` as ``scripts/setup_peers.sh`` builds it, or None where it was not built."""
    python = peers_dir() / name / "bin" / "python"
    return python if python.exists() else None


def peer_python_flag(flag: str | None, name: str) -> Path | None:
    """``--<name>-python``: None (not given) finds the peer ``setup_peers.sh`` builds (None when not built), ''
    leaves the peer out (None), a path must exist."""
    if flag is None:
        return default_peer_python(name)
    if flag == "":
        return None
    if not Path(flag).exists():
        raise FileNotFoundError(f"--{name}-python {flag}: no such file; expected the Python of the venv that "
                                f"`bash scripts/setup_peers.sh {name}` builds, or '' to leave {name} out")
    return Path(flag)


class PeerProcess:
    """One peer worker (``haloflow/bench/peers/<script>.py``) running under ``python``."""

    def __init__(self, python: str | os.PathLike, script: str, setup: dict, threads: int | None = None):
        env = dict(os.environ)
        if threads is not None:  # the peer's torch reads these at import, before its own set_num_threads
            env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        env.pop("PYTHONPATH", None)  # our site-packages must not shadow the peer's torch
        path = _SCRIPTS / f"{script}.py"
        self.name = script
        # stderr=None: the peer writes to our fd 2 itself; sys.stderr may be no file (pytest's capsys, a notebook)
        self._proc = subprocess.Popen([str(python), str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=None, text=True, env=env, bufsize=1)
        try:
            reply = self._ask({"setup": setup})
        except BaseException:  # no caller holds us yet to close us: end the process and its pipes here
            self.close()
            raise
        self.info = reply.get("info", {})

    def _ask(self, message: dict) -> dict:
        try:
            self._proc.stdin.write(json.dumps(message) + "\n")
            self._proc.stdin.flush()
        except BrokenPipeError:
            pass  # the peer died; its exit status is reported below
        line = self._proc.stdout.readline()
        if not line:
            code = self._proc.wait()
            raise PeerError(f"peer {self.name} exited with status {code} (its stderr is above)")
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            raise PeerError(f"peer {self.name} wrote a line that is not JSON: {line[:200]!r}") from None
        if "error" in reply:
            raise PeerError(f"peer {self.name}: {reply['error']}")
        return reply

    def call(self, cmd: str, **kwargs) -> dict:
        """Ask for one unit of work; returns the peer's reply (its own timing inside)."""
        return self._ask({"cmd": cmd, **kwargs})

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self._proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                self._proc.stdin.close()
                self._proc.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        for pipe in (self._proc.stdin, self._proc.stdout):  # a peer that died on its own left them open
            try:
                pipe.close()
            except BrokenPipeError:  # flushing a write the dead peer never read
                pass

    def __enter__(self) -> "PeerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
