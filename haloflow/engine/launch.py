"""Starting torchrun on this machine: what ``--nproc K``, the multi-process tests and the benchmarks use.

``launch_torchrun`` starts K local ranks of a script or module under ``torchrun --standalone`` and waits for them
(``haloflow.cli.runtime_args.relaunch_if_asked`` uses it for every trainer's ``--nproc``).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence

from haloflow.errors import ConfigError

__all__ = ["torchrun_command", "launch_torchrun"]

log = logging.getLogger(__name__)


def torchrun_command(nproc: int, target: Sequence[str], *, max_restarts: int = 0, report: bool = False) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node K [--max-restarts N] *target``.

    ``target`` is a script and its arguments, or ``["-m", module, *arguments]``. ``--standalone`` lets the
    rendezvous store bind a free port itself: a port picked here and released would race with other launches.
    With ``max_restarts`` > 0, torchrun restarts every rank when one fails, up to that many times. With ``report``,
    ``haloflow.engine.torchrun_main`` runs torchrun instead: a failure is a JSON report, not a traceback.
    """
    if nproc < 1:
        raise ConfigError(f"--nproc must be >= 1, got {nproc}")
    if max_restarts < 0:
        raise ConfigError(f"--max-restarts must be >= 0, got {max_restarts}")
    restarts = ["--max-restarts", str(max_restarts)] if max_restarts else []
    entry = "haloflow.engine.torchrun_main" if report else "torch.distributed.run"
    return [sys.executable, "-m", entry, "--standalone", "--nproc-per-node", str(nproc), *restarts,
            *map(str, target)]


def launch_torchrun(
    nproc: int,
    target: Sequence[str],
    *,
    threads_per_rank: int | None = None,
    env: dict[str, str] | None = None,
    max_restarts: int = 0,
    report: bool = False,
    **run_kwargs,
) -> subprocess.CompletedProcess:
    """Run ``target`` as ``nproc`` local ranks under torchrun and wait for them (``subprocess.run``).

    Args:
        nproc: number of ranks, >= 1.
        target: a script and its arguments, or ``["-m", module, *arguments]``.
        threads_per_rank: OMP_NUM_THREADS of every rank. Default: the caller's OMP_NUM_THREADS if set, else
            cores // nproc, so that K ranks share the cores instead of each taking all of them.
        env: extra environment variables for the ranks (over this process's environment).
        max_restarts: how many times torchrun may restart the ranks after one fails (0: none).
        report: write the ranks' exit codes to ``$HALOFLOW_TORCHRUN_REPORT`` on failure instead of torchrun's
            traceback (``torchrun_main``).
        run_kwargs: passed to ``subprocess.run`` (``capture_output``, ``timeout``, ``cwd``, ...). On a timeout
            the ranks are stopped too: torchrun starts each rank in a session of its own, so killing torchrun
            (what ``subprocess.run`` does) would leave them running, holding the cores and the output pipes.
    """
    cmd = torchrun_command(nproc, target, max_restarts=max_restarts, report=report)
    threads = threads_per_rank or os.environ.get("OMP_NUM_THREADS") or max(1, (os.cpu_count() or 1) // nproc)
    full_env = {**os.environ, "OMP_NUM_THREADS": str(threads), **(env or {})}
    log.info("starting: %s", " ".join(cmd))
    timeout = run_kwargs.pop("timeout", None)
    check = run_kwargs.pop("check", False)
    if run_kwargs.pop("capture_output", False):
        run_kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with subprocess.Popen(cmd, env=full_env, **run_kwargs) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop_torchrun(proc)
            raise
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


def _stop_torchrun(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM torchrun, which stops its ranks and exits; after ``grace_s``, SIGKILL it and every rank."""
    ranks = _children(proc.pid)  # read before torchrun goes: its ranks are then re-parented
    proc.terminate()
    try:
        proc.communicate(timeout=grace_s)
        return
    except subprocess.TimeoutExpired:
        pass
    for pid in [*ranks, proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # already gone
            pass
    proc.communicate()


def _children(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (from /proc; empty where there is no /proc)."""
    found = []
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    ppid = int(f.read().rsplit(") ", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                found.append(int(entry.name))
    return found
