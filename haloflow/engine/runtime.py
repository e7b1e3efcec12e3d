"""Process-group setup from torchrun's environment, and starting torchrun on this machine.

``torchrun --nproc-per-node K ...`` sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT on every
process. ``init_from_env`` reads them, picks gloo on CPU and NCCL on CUDA, and passes a ``timeout`` so that a
collective waiting on a dead peer raises instead of hanging forever. ``launch_torchrun`` starts K local ranks
of a script or module (what ``--nproc K`` and the multi-process tests and benchmarks do).
"""

from __future__ import annotations

import datetime as _dt
import gc
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from haloflow.errors import ConfigError

__all__ = ["DistContext", "init_from_env", "shutdown", "torchrun_command", "launch_torchrun"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistContext:
    """Who this process is. ``group`` is None when running single-process (world size 1, no init)."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None
    group: object | None = None

    @property
    def distributed(self) -> bool:
        return self.group is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None


def init_from_env(*, timeout_s: float = 120.0, device: str = "auto", force_distributed: bool = False) -> DistContext:
    """Join the process group described by torchrun's variables.

    Args:
        timeout_s: how long any collective may wait for a peer before raising (a dead rank gives an error on
            the others within about this time, not a hang).
        device: "auto" (CUDA if available, else CPU), "cpu" or "cuda".
        force_distributed: initialise a group even for WORLD_SIZE=1 (used by tests of the engine itself).

    Returns a ``DistContext``; without torchrun's variables (or WORLD_SIZE=1) it is single-process, no group.
    """
    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local = _env_int("LOCAL_RANK", 0)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    if device == "cuda":
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    if world == 1 and not force_distributed:
        return DistContext(rank=0, world_size=1, local_rank=0, device=dev, backend=None, group=None)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if not dist.is_initialized():
        # NCCL binds the group to this rank's device up front (barriers then know where to run)
        extra = {"device_id": dev} if dev.type == "cuda" else {}
        dist.init_process_group(backend=backend, timeout=_dt.timedelta(seconds=timeout_s), **extra)
        log.info("rank %d/%d joined the %s group", rank, world, backend)
    return DistContext(
        rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local, device=dev,
        backend=backend, group=dist.group.WORLD,
    )


def shutdown(*, barrier: bool = True) -> None:
    """Leave the process group cleanly: wait until every rank is done communicating, then destroy it.

    Without the barrier a fast rank can tear its gloo connections down while a peer's last messages are still in
    flight, and gloo then aborts that peer at exit ("terminate called without an active exception": seen in about
    one run in three of a 3-rank script before the barrier, none in 12 after). Pass ``barrier=False`` on an error
    path, where a peer may be dead and the barrier would only wait out the timeout.

    The process group's C++ object dies with its last Python reference. If that reference sits in a reference
    cycle, it lives on until interpreter shutdown, and gloo aborts there the same way (6 runs in 60 of a 3-rank
    script whose gradient hooks made such a cycle; none in 30 once they did not). Hence the ``gc.collect()``, and
    hooks that hold their owner weakly (``grad_sync``).
    """
    if dist.is_initialized():
        if barrier:
            dist.barrier()
        dist.destroy_process_group()
    gc.collect()


def torchrun_command(nproc: int, target: Sequence[str]) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node K *target``.

    ``target`` is a script and its arguments, or ``["-m", module, *arguments]``. ``--standalone`` lets the
    rendezvous store bind a free port itself: a port picked here and released would race with other launches.
    """
    if nproc < 1:
        raise ConfigError(f"--nproc must be >= 1, got {nproc}")
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            *map(str, target)]


def launch_torchrun(
    nproc: int,
    target: Sequence[str],
    *,
    threads_per_rank: int | None = None,
    env: dict[str, str] | None = None,
    **run_kwargs,
) -> subprocess.CompletedProcess:
    """Run ``target`` as ``nproc`` local ranks under torchrun and wait for them (``subprocess.run``).

    Args:
        nproc: number of ranks, >= 1.
        target: a script and its arguments, or ``["-m", module, *arguments]``.
        threads_per_rank: OMP_NUM_THREADS of every rank. Default: the caller's OMP_NUM_THREADS if set, else
            cores // nproc, so that K ranks share the cores instead of each taking all of them.
        env: extra environment variables for the ranks (over this process's environment).
        run_kwargs: passed to ``subprocess.run`` (``capture_output``, ``timeout``, ``cwd``, ...). On a timeout
            the ranks are stopped too: torchrun starts each rank in a session of its own, so killing torchrun
            (what ``subprocess.run`` does) would leave them running, holding the cores and the output pipes.
    """
    cmd = torchrun_command(nproc, target)
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
