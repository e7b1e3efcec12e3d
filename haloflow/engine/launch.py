"""Starting torchrun on this machine: what ``--nproc K``, the multi-process tests and the benchmarks use.

``launch_torchrun`` starts K local ranks of a script or module under torchrun and waits for them
(``haloflow.cli.runtime_args.relaunch_if_asked`` uses it for every trainer's ``--nproc``). One node runs
``torchrun --standalone``; several (``NodeLayout``) meet at a c10d rendezvous that node 0 hosts.

The job lives and dies with the launcher::

    launcher (this process)    SIGINT / SIGTERM: passed on to torchrun once, which passes it to its ranks and
      |                          SIGKILLs those still there after STOP_GRACE_S; the launcher kills what is left
      |                          after 2 x STOP_GRACE_S, or at a second signal; then raises JobStopped
      +- torchrun agent        a session of its own (a terminal's Ctrl-C reaches the launcher alone);
           |                     parent-death signal SIGTERM: the launcher gone (kill -9), it stops its ranks
           +- rank 0 .. K-1    each in a session of its own (torchrun's doing); the CLI's ranks get SIGTERM
                                 when the agent goes

A parent-death signal (Linux ``prctl(PR_SET_PDEATHSIG)``, elsewhere a thread watching ``os.getppid()``) is what
stops a job whose launcher was killed with SIGKILL, which no handler sees: ``die_with_parent`` is called by the
agent (``torchrun_main``) and by every rank of the CLI (``haloflow.cli.run_command``), each reading its parent's
pid from ``$HALOFLOW_PARENT_PID``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from haloflow.errors import ConfigError
from haloflow.utils.atomic import process_alive

__all__ = ["NodeLayout", "JobStopped", "torchrun_command", "launch_torchrun", "die_with_parent", "PARENT_ENV",
           "STOP_GRACE_S"]

log = logging.getLogger(__name__)

PARENT_ENV = "HALOFLOW_PARENT_PID"  # the pid a launched process should die with (set by whoever starts it)
# Seconds torchrun gives its ranks to stop after a signal before it kills them (its own default is 30: a
# Ctrl-C would wait that long on a rank stuck in a collective); the launcher kills what is left a little later.
STOP_GRACE_S = 5.0
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


@dataclass(frozen=True, kw_only=True)
class NodeLayout:
    """The machines of one job: ``nnodes`` torchrun agents, this one ``node_rank``, meeting at ``rdzv_endpoint``.

    Node 0 hosts the c10d rendezvous store at ``rdzv_endpoint`` (its own address and a free port), and every node
    is given the same endpoint. The ranks are numbered by the rendezvous, not by node rank: rank 0 (which writes
    ``--save`` and ``--log-jsonl``) may run on any node.
    """

    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # HOST:PORT; only with nnodes > 1

    def __post_init__(self) -> None:
        if self.nnodes < 1:
            raise ConfigError(f"--nnodes must be >= 1, got {self.nnodes}", field="nnodes")
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"--node-rank {self.node_rank} is not one of the {self.nnodes} nodes "
                              f"(0 .. {self.nnodes - 1})", field="node_rank")
        if self.nnodes == 1:
            if self.rdzv_endpoint is not None:
                raise ConfigError("--rdzv-endpoint is where several nodes meet; give --nnodes N (N > 1) too, or "
                                  "leave it out for one node", field="rdzv_endpoint")
            return
        if self.rdzv_endpoint is None:
            raise ConfigError(f"--nnodes {self.nnodes} needs --rdzv-endpoint HOST:PORT (node 0's address and a "
                              "free port, the same on every node)", field="rdzv_endpoint")
        host, _, port = self.rdzv_endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--rdzv-endpoint must be HOST:PORT with a port in 1 .. 65535, got "
                              f"{self.rdzv_endpoint!r}", field="rdzv_endpoint")

    def torchrun_args(self) -> list[str]:
        """``--standalone`` for one node: the rendezvous store binds a free port itself (a port picked here and
        released would race with other launches). Several: c10d at the endpoint, node 0 its host."""
        if self.nnodes == 1:
            return ["--standalone"]
        return ["--nnodes", str(self.nnodes), "--rdzv-backend", "c10d", "--rdzv-endpoint", self.rdzv_endpoint,
                "--rdzv-conf", f"is_host={int(self.node_rank == 0)}"]


class JobStopped(KeyboardInterrupt):
    """The launcher got SIGINT or SIGTERM (``signum``) and stopped the job; ``result`` is how torchrun ended."""

    def __init__(self, signum: int, result: subprocess.CompletedProcess):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum, self.result = signum, result


def torchrun_command(nproc: int, target: Sequence[str], *, max_restarts: int = 0, report: bool = False,
                     nodes: NodeLayout | None = None) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node K [--max-restarts N] *target``.

    ``target`` is a script and its arguments, or ``["-m", module, *arguments]``. With ``nodes`` of more than one
    node, the c10d rendezvous of ``NodeLayout.torchrun_args`` replaces ``--standalone``. With ``max_restarts``
    > 0, torchrun restarts every rank when one fails, up to that many times. With ``report``,
    ``haloflow.engine.torchrun_main`` runs torchrun instead: a failure is a JSON report, not a traceback.
    """
    if nproc < 1:
        raise ConfigError(f"--nproc must be >= 1, got {nproc}")
    if max_restarts < 0:
        raise ConfigError(f"--max-restarts must be >= 0, got {max_restarts}")
    restarts = ["--max-restarts", str(max_restarts)] if max_restarts else []
    entry = "haloflow.engine.torchrun_main" if report else "torch.distributed.run"
    return [sys.executable, "-m", entry, *(nodes or NodeLayout()).torchrun_args(), "--nproc-per-node", str(nproc),
            *restarts, *map(str, target)]


def launch_torchrun(
    nproc: int,
    target: Sequence[str],
    *,
    threads_per_rank: int | None = None,
    env: dict[str, str] | None = None,
    max_restarts: int = 0,
    report: bool = False,
    nodes: NodeLayout | None = None,
    **run_kwargs,
) -> subprocess.CompletedProcess:
    """Run ``target`` as ``nproc`` local ranks under torchrun and wait for them (``subprocess.run``).

    Args:
        nproc: number of ranks on this machine, >= 1.
        target: a script and its arguments, or ``["-m", module, *arguments]``.
        threads_per_rank: OMP_NUM_THREADS of every rank. Default: the caller's OMP_NUM_THREADS if set, else
            cores // nproc, so that K ranks share the cores instead of each taking all of them.
        env: extra environment variables for the ranks (over this process's environment).
        max_restarts: how many times torchrun may restart the ranks after one fails (0: none).
        report: write the ranks' exit codes to ``$HALOFLOW_TORCHRUN_REPORT`` on failure instead of torchrun's
            traceback (``torchrun_main``); its agent also dies with this process (``die_with_parent``).
        nodes: this machine's place in a job of several (default: one node, ``--standalone``).
        run_kwargs: passed to ``subprocess.run`` (``capture_output``, ``timeout``, ``cwd``, ...). On a timeout
            the ranks are stopped too: torchrun starts each rank in a session of its own, so killing torchrun
            (what ``subprocess.run`` does) would leave them running, holding the cores and the output pipes.

    Raises:
        JobStopped: this process got SIGINT or SIGTERM while waiting (from the main thread); the job was given
            the same signal and is gone.
    """
    from haloflow.utils.cores import cores_here  # affinity (taskset, cpusets), not os.cpu_count

    cmd = torchrun_command(nproc, target, max_restarts=max_restarts, report=report, nodes=nodes)
    threads = threads_per_rank or os.environ.get("OMP_NUM_THREADS") or max(1, cores_here() // nproc)
    full_env = {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(int(STOP_GRACE_S)), **os.environ,
                "OMP_NUM_THREADS": str(threads), PARENT_ENV: str(os.getpid()), **(env or {})}
    log.info("starting: %s", " ".join(cmd))
    timeout = run_kwargs.pop("timeout", None)
    check = run_kwargs.pop("check", False)
    if run_kwargs.pop("capture_output", False):
        run_kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # a session of its own: a terminal's Ctrl-C goes to this process alone, which forwards it once (torchrun
    # in our process group would get it too and pass it on twice)
    with subprocess.Popen(cmd, env=full_env, start_new_session=True, **run_kwargs) as proc:
        with _StopForwarding(proc) as received:
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                _stop_torchrun(proc)
                raise
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if received:
        raise JobStopped(received[0], done)
    if check:
        done.check_returncode()
    return done


class _StopForwarding:
    """While torchrun runs: SIGINT and SIGTERM to this process go to torchrun (which passes them to its ranks
    and waits ``STOP_GRACE_S`` for them); the job is killed after twice that, or at once on a second signal.
    Yields the signals received. Only in the main thread (where Python runs signal handlers)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.received, self.previous = proc, [], {}
        self.timer: threading.Timer | None = None

    def __enter__(self) -> list[int]:
        if threading.current_thread() is threading.main_thread():
            # set even where SIGINT was ignored (a shell's `cmd &`): `kill -INT` is then meant for us
            self.previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        return self.received

    def __exit__(self, *exc) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)  # None: set outside Python
        if self.timer is not None:
            self.timer.cancel()

    def _on_signal(self, signum, frame) -> None:
        self.received.append(signum)
        if len(self.received) > 1:
            _kill_job(self.proc.pid)
            return
        try:
            os.kill(self.proc.pid, signum)
        except ProcessLookupError:  # torchrun already ended
            return
        self.timer = threading.Timer(2 * STOP_GRACE_S, _kill_job, args=(self.proc.pid,))
        self.timer.daemon = True
        self.timer.start()


def _stop_torchrun(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM torchrun, which stops its ranks and exits; after ``grace_s``, SIGKILL it and every rank."""
    ranks = _descendants(proc.pid)  # read before torchrun goes: its ranks are then re-parented
    proc.terminate()
    try:
        proc.communicate(timeout=grace_s)
        return
    except subprocess.TimeoutExpired:
        pass
    _kill(ranks + [proc.pid])
    proc.communicate()


def _kill_job(pid: int) -> None:
    """SIGKILL torchrun ``pid`` and every process below it (its ranks first, while they are still its own)."""
    _kill(_descendants(pid) + [pid])


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # already gone
            pass


def _descendants(pid: int) -> list[int]:
    """Pids below ``pid``: children, their children, ... (from /proc; empty where there is none)."""
    parents = {}
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    parents[int(entry.name)] = int(f.read().rsplit(") ", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [pid]
    while frontier:
        below = [p for p, parent in parents.items() if parent in frontier]
        found += below
        frontier = below
    return found


# ------------------------------------------------------------------------------------------------ parent death
def die_with_parent(signum: int = signal.SIGTERM) -> None:
    """Get ``signum`` when the process named by ``$HALOFLOW_PARENT_PID`` (our parent) dies; nothing when the
    variable is unset. Raised at once if the parent is already gone (it died before we could ask)."""
    raw = os.environ.get(PARENT_ENV)
    if not raw or not raw.isdigit():
        return
    parent = int(raw)
    if not _pdeathsig(signum):
        threading.Thread(target=_watch_parent, args=(os.getppid(), signum), daemon=True,
                         name="haloflow-parent-watch").start()
    if os.getppid() != parent and not process_alive(parent):
        os.kill(os.getpid(), signum)


def _pdeathsig(signum: int) -> bool:
    """Linux: ask the kernel for ``signum`` when the parent thread exits. False where that cannot be done."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int, signum: int, every_s: float = 0.5) -> None:
    while os.getppid() == parent:
        time.sleep(every_s)
    os.kill(os.getpid(), signum)
