"""The runtime every trainer shares: the parallel layout, the process group's life, the device, and reporting.

``torchrun --nproc-per-node K ...`` sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT on every
process. ``init_from_env`` reads them into a validated ``ParallelLayout`` (K, rank, device, backend), picks gloo
on CPU and NCCL on CUDA, and passes a ``timeout`` so that a collective waiting on a dead peer raises instead of
hanging forever. ``Runtime`` wraps one run::

    Runtime.start(RuntimeConfig)        join the group (or run alone), choose the device, open the metrics log
      rt.started()                      start-up done: group, data, model, checks (reported apart from epochs)
      rt.reporter(total, unit, desc)    a progress bar on a terminal, else a line every N epochs or steps
      rt.metrics.write(record)          JSON lines for programs (``--log-jsonl``), rank 0 only
    exit                                destroy the group it created (no barrier if the block raised)

Trainers (``engine/gcn/train.py``, ``engine/dlrm/train.py``) build on it; starting the ranks themselves is
``engine/launch.py``.
"""

from __future__ import annotations

import datetime as _dt
import gc
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from haloflow import host
from haloflow.engine.checkpoint import Checkpointer
from haloflow.engine.comm import register_peers
from haloflow.engine.run_config import DEVICES, RuntimeConfig, expect_parts
from haloflow.errors import ConfigError
from haloflow.utils.atomic import atomic_output, atomic_write_text, is_regular_target, open_stream, reporting_full_disk
from haloflow.utils.progress import progress_bar
from haloflow.host.threads import (BusyMeter, ThreadBudget, ThreadGovernor, cores_here, fitting_threads,
                                    follow_torch_threads, reproducible_blas, warm_vector_math)

__all__ = [
    "DEVICES", "ParallelLayout", "expect_parts", "resolve_device", "init_from_env", "shutdown", "RuntimeConfig", "Runtime",
    "MetricsLog", "Reporter", "TrainResult", "save_atomic", "to_device", "synchronize",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParallelLayout:
    """Who this process is and where it computes: K ranks, this rank, its device and the backend.

    ``group`` is None when the run is a single process without a group (K = 1). Validated once here, so that code
    downstream never checks K, rank or device again; ``expect_parts`` is the one check of a partition's or
    plan's K against the number of processes.
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None
    group: object | None = None

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is not in [0, {self.world_size}): WORLD_SIZE={self.world_size}, "
                              f"RANK={self.rank}")
        if self.backend not in (None, "gloo", "nccl"):
            raise ConfigError(f"backend must be gloo or nccl, got {self.backend!r}")
        if self.backend == "nccl" and self.device.type != "cuda":
            raise ConfigError(f"NCCL needs a CUDA device, but this rank computes on {self.device}")
        if self.group is None and self.world_size != 1:
            raise ConfigError(f"{self.world_size} ranks need a process group")

    @property
    def distributed(self) -> bool:
        return self.group is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def expect_parts(self, parts: int, source: str) -> None:
        """Raise unless ``source`` (a partition folder, a plan) was made for this many processes."""
        expect_parts(parts, self.world_size, source)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None


def resolve_device(device: str, local_rank: int = 0) -> torch.device:
    """"auto" -> CUDA device ``local_rank`` when CUDA is present, else the CPU; "cuda" without CUDA is an error."""
    if device not in DEVICES:
        raise ConfigError(f"device must be one of {DEVICES}, got {device!r}", field="device")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("device 'cuda' was asked for, but torch sees no CUDA device (a CPU build of torch, or "
                          "no GPU here); use --device cpu", field="device")
    if local_rank >= torch.cuda.device_count():
        raise ConfigError(f"local rank {local_rank} has no GPU: {torch.cuda.device_count()} visible", field="device")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def init_from_env(*, timeout_s: float = 120.0, device: str = "auto", force_distributed: bool = False) -> ParallelLayout:
    """Join the process group described by torchrun's variables.

    Args:
        timeout_s: how long any collective may wait for a peer before raising (a dead rank gives an error on
            the others within about this time, not a hang).
        device: "auto" (CUDA if available, else CPU), "cpu" or "cuda".
        force_distributed: initialise a group even for WORLD_SIZE=1 (used by tests of the engine itself).

    Returns a ``ParallelLayout``; without torchrun's variables (or WORLD_SIZE=1) it is single-process, no group.
    """
    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local = _env_int("LOCAL_RANK", 0)
    dev = resolve_device(device, local)
    if world == 1 and not force_distributed and not dist.is_initialized():
        return ParallelLayout(rank=0, world_size=1, local_rank=0, device=dev, backend=None, group=None)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if not dist.is_initialized():
        # NCCL binds the group to this rank's device up front (barriers then know where to run)
        extra = {"device_id": dev} if dev.type == "cuda" else {}
        timeout = _dt.timedelta(seconds=timeout_s)
        store = _attempt_store(timeout)
        if store is not None:
            extra.update(store=store, rank=rank, world_size=world)
        dist.init_process_group(backend=backend, timeout=timeout, **extra)
        log.info("rank %d/%d joined the %s group", rank, world, backend)
    return ParallelLayout(
        rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local, device=dev,
        backend=dist.get_backend(), group=dist.group.WORLD,
    )


def _attempt_store(timeout: _dt.timedelta):
    """After torchrun restarted the ranks, a store whose keys are this attempt's alone (None otherwise).

    torchrun's agent keeps one store for the whole job, so the keys gloo wrote in an earlier attempt (each rank's
    address) are still there, and a restarted rank that reads a peer's key before the peer rewrites it connects
    to a dead process (seen: every rank of a restarted DLRM run waited out the timeout in init_process_group).
    """
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if attempt == "0" or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    return dist.PrefixStore(f"haloflow/attempt{attempt}/", _store_client(timeout))


def _store_client(timeout: _dt.timedelta):
    """A client of the rendezvous store torchrun's MASTER_ADDR and MASTER_PORT point at."""
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)


def _roll_call_store():
    """This attempt's part of torchrun's rendezvous store, for ``comm.peer_note``'s roll call after a failed
    collective; None outside torchrun or when the store cannot be reached (the roll call is only an extra)."""
    if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ or not dist.is_initialized():
        return None
    try:
        client = _store_client(_dt.timedelta(seconds=10))
    except Exception:  # a store this process did not start and cannot reach
        return None
    run = os.environ.get("TORCHELASTIC_RUN_ID", "run")
    return dist.PrefixStore(f"haloflow/{run}/attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/", client)


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


class Runtime:
    """One training run's process: its layout, its metrics log and its start-up time.

    Use as a context manager; a group that ``start`` created is destroyed on exit (without waiting for peers when
    the block raised, since a peer may be gone)::

        with Runtime.start(config.runtime, distributed=True) as rt:
            ...  rt.layout.device, rt.metrics.write({...}), rt.reporter(total=..., unit="epoch")
    """

    def __init__(self, config: RuntimeConfig, layout: ParallelLayout, *, owns_group: bool, t0: float):
        self.config = config
        self.layout = layout
        self.owns_group = owns_group
        self._t0 = t0
        self.startup_s: float | None = None
        self.metrics = MetricsLog(config.log_jsonl if layout.is_main else None)
        threads = torch.get_num_threads()
        # the thread count may follow the load only where the numbers cannot follow it
        adapt = config.adapt_threads and threads > 1 and reproducible_blas()
        self.governor = ThreadGovernor(limit=threads) if adapt else None
        if config.adapt_threads and threads > 1 and not adapt and layout.is_main:
            log.info("threads stay at %d: MKL's reproducible mode could not be set (no MKL, or a product ran in this "
                     "process before the run started), so a changing thread count would change the rounding",
                     threads)
        # Without the governor, start-up is watched once for other processes' load (see `started`). A lone
        # process only: sibling ranks loading their data would read as others.
        watch = self.governor is None and threads > 1 and layout.is_main and self.thread_budget.ranks == 1
        self._startup_load = BusyMeter() if watch else None

    @classmethod
    def start(cls, config: RuntimeConfig | None = None, *, join: bool = True, distributed: bool = False) -> "Runtime":
        """Join torchrun's group when WORLD_SIZE > 1 (``distributed``: even with one rank; ``join=False``: never,
        the run is this process alone, as training on a whole data set is)."""
        config = config or RuntimeConfig()
        t0 = time.perf_counter()
        host.apply()  # the Python API's entry: the CLI applied it already (haloflow/host/__init__.py)
        if config.adapt_threads:  # before this run's first product: MKL takes the mode only then
            reproducible_blas()
        follow_torch_threads()  # before any numba kernel can reset torch's thread count
        warm_vector_math()  # before any parallel op: MKL's vector math picks its paths at the first call
        if not join:
            layout = ParallelLayout(rank=0, world_size=1, local_rank=0, device=resolve_device(config.device),
                                    backend=None, group=None)
            return cls(config, layout, owns_group=False, t0=t0)._say_threads()
        owns = not dist.is_initialized()
        layout = init_from_env(timeout_s=config.timeout_s, device=config.device, force_distributed=distributed)
        register_peers(layout.group, _roll_call_store())  # so a failed collective can name the rank gone silent
        return cls(config, layout, owns_group=owns and layout.distributed, t0=t0)._say_threads()

    def _say_threads(self) -> "Runtime":
        """The start-up line (rank 0): ranks x threads against the cores, and how idle threads wait; a warning
        when the threads outnumber the cores, with the setting that fits."""
        if self.layout.is_main:
            budget = self.thread_budget
            log.info("%s; %s", budget.describe(), host.describe())
            if budget.oversubscribed:
                log.warning("oversubscribed: %s", budget.advice())
        return self

    def between_units(self) -> None:
        """Called by the loop after every unit: the thread count follows the free cores (``adapt_threads``)."""
        if self.governor is not None:
            changed = self.governor.tick()
            if changed is not None:
                log.info("threads -> %d: other processes keep %.1f of %d cores busy", changed, self.governor.others,
                         len(self.governor.cpus))

    def checkpointer(self, kind: str, identity: dict) -> Checkpointer:
        """This run's checkpoints (``config.checkpoint``): what to resume from, when and where to save."""
        return Checkpointer(self.config.checkpoint, self.layout, kind, identity)

    @property
    def threads(self) -> int:
        """Threads this rank computes with (OMP_NUM_THREADS under torchrun: the cores divided among the ranks)."""
        return torch.get_num_threads()

    @property
    def thread_budget(self) -> ThreadBudget:
        """The ranks on this machine (torchrun's LOCAL_WORLD_SIZE) x this rank's threads, against its cores."""
        here = _env_int("LOCAL_WORLD_SIZE", self.layout.world_size) if self.layout.distributed else 1
        return ThreadBudget(ranks=here, threads=self.threads, cores=cores_here())

    def describe(self) -> str:
        """``"2 ranks x 1 thread, gloo on cpu"``: what a person needs to read the timings."""
        lay = self.layout
        ranks = f"{lay.world_size} rank{'s' if lay.world_size > 1 else ''}"
        return (f"{ranks} x {self.threads} thread{'s' if self.threads > 1 else ''}, "
                f"{lay.backend or 'no group'} on {lay.device.type} ({cores_here()} cores here)")

    def started(self) -> float:
        """Mark the end of start-up (group, data, model, first checks); returns the start-up seconds.

        When other processes kept the cores busy meanwhile, so that fewer threads than this run's would fit beside
        them, a warning says so: with fixed threads (``--fixed-threads``, or no reproducible BLAS) every parallel
        region waits for the one the scheduler parks (a step beside two busy processes took 1.5-2.4x its 1-thread
        time, ``bench contention``).
        """
        self.startup_s = time.perf_counter() - self._t0
        meter, self._startup_load = self._startup_load, None
        if meter is not None and meter.elapsed() >= 0.2:  # shorter, and one busy burst reads as a busy machine
            others, cores = meter.others(), len(meter.cpus)
            if fitting_threads(cores, others) < self.threads:
                log.warning("other processes kept %.1f of %d cores busy during start-up; with %d fixed threads every "
                            "parallel region waits for whichever the scheduler parks (fixed: --fixed-threads, or "
                            "see the start-up line)", others, cores, self.threads)
        return self.startup_s

    def reporter(self, *, total: int, unit: str, desc: str, done: int = 0) -> "Reporter":
        """Progress of ``total`` epochs or steps, ``done`` of them already (by the checkpoint resumed from)."""
        every = self.config.log_every or max(1, (total - done) // 10)
        return Reporter(total=total, unit=unit, desc=desc, every=every, done=done,
                        enabled=self.layout.is_main, progress=self.config.progress)

    def close(self, ok: bool = True) -> None:
        self.metrics.close()
        if self.owns_group:
            shutdown(barrier=ok)
            self.owns_group = False

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(ok=exc_type is None)


@dataclass(eq=False)
class TrainResult:
    """What every trainer returns on every rank: the layout, the times, the final weights and the JSON records.

    ``startup_s`` (group, data, model, checks) is reported apart from ``train_s`` (the epochs or steps), and
    ``threads`` is what each rank computed with: on a machine with fewer cores than ranks x threads, K ranks
    are slower than one, and the numbers say why.
    """

    layout: ParallelLayout
    startup_s: float
    train_s: float
    threads: int
    state_dict: dict[str, torch.Tensor]
    records: list[dict]
    devices: dict[str, set[str]] = field(default_factory=dict)  # what -> the device types its tensors were on

    @property
    def rank(self) -> int:
        return self.layout.rank

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    def format_summary(self, title: str, rows: list[list], *, epochs: int | None = None,
                       steps: int | None = None) -> str:
        """A two-column table: the model's own rows, then how it ran (ranks, threads, device, times)."""
        from haloflow.utils.table import format_table

        lay = self.layout
        per = [["train s per epoch", self.train_s / epochs]] if epochs else []
        per += [["train s per step", self.train_s / steps]] if steps else []
        run = [["ranks x threads", f"{lay.world_size} x {self.threads} ({cores_here()} cores here)"],
               ["device", f"{lay.device} ({lay.backend or 'one process'})"],
               ["start-up s", self.startup_s], ["train s", self.train_s], *per]
        return format_table(["", "value"], [[k, v] for k, v in rows + run], float_fmt=".4f", title=title)


def save_atomic(path: str | Path, payload: dict) -> None:
    """``torch.save`` to a temporary name beside ``path``, then rename: never a half-written file. A FIFO or a
    device (``/dev/null``) is written through; a full disk is one ``OutputError`` naming ``path``."""
    with atomic_output(path, "wb") as f:
        torch.save(payload, f)


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Move a host tensor to ``device``; to CUDA through pinned memory with a non-blocking copy."""
    if x.device == device:
        return x
    if device.type == "cuda" and x.device.type == "cpu":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (before reading a clock); nothing to wait for on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------------------------------------ reporting
def _json_safe(value):
    """NaN and infinities become null (JSON has no such numbers); tuples become lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


class MetricsLog:
    """JSON lines for programs: one object per call to ``write``, on rank 0 only (``path=None``: nothing).

    A stream from the first record: each line is written to ``path`` and flushed at once, so ``tail -f`` follows
    a run and a crash or Ctrl-C keeps the lines written so far. An existing regular file is truncated (as
    ``--save`` replaces its file); a FIFO, a character device or ``/proc/self/fd/1`` is written through. The file
    is opened at the first record, so a run that stops before it (a bad input found at start-up) leaves an
    existing log as it was and creates none.
    """

    def __init__(self, path: Path | None):
        self.path = path
        self.records: list[dict] = []
        self._file = None

    def after_restart(self, units_done: int, attempt: int) -> None:
        """A restarted attempt (torchrun's ``--max-restarts``) continues the log instead of truncating it: the
        lines of units the checkpoint it resumed from holds (``units_done`` <= the checkpoint's) stay, the lines
        of units that will be trained again go, and a ``restart`` line says where the run picked up, so that
        every unit is in the log once. A FIFO or a device is written through as it is."""
        if self.path is None:
            return
        if is_regular_target(self.path) and Path(self.path).is_file():
            kept = []
            for line in Path(self.path).read_text().splitlines():
                try:
                    record = json.loads(line)
                except ValueError:  # a line the dead attempt left half-written
                    continue
                if isinstance(record, dict) and record.get("units_done", units_done + 1) <= units_done:
                    kept.append(line)
            atomic_write_text(self.path, "".join(k + "\n" for k in kept))
        self._file = open_stream(self.path, append=True)
        self.write({"kind": "restart", "attempt": attempt, "units_done": units_done})

    def write(self, record: dict) -> None:
        record = _json_safe(record)
        self.records.append(record)
        if self.path is not None and self._file is None:
            self._file = open_stream(self.path)
        if self._file is not None:
            with reporting_full_disk(self.path):
                self._file.write(json.dumps(record, allow_nan=False) + "\n")
                self._file.flush()

    def close(self) -> None:
        if self._file is None:
            return
        file, self._file = self._file, None
        try:
            file.close()
        except OSError:  # a reader of a FIFO gone away, or a full disk the last write already reported
            pass


class Reporter:
    """Output for people, on rank 0: a progress bar on a terminal, otherwise a line every ``every`` steps;
    nothing at all with ``progress=False`` (warnings and the run's summary are not the reporter's)."""

    def __init__(self, *, total: int, unit: str, desc: str, every: int, enabled: bool, progress: bool,
                 stream=None, done: int = 0):
        self.total, self.unit, self.desc, self.every = total, unit, desc, every
        self.enabled = enabled and progress
        self.stream = stream or sys.stdout
        self.done = done
        self.bar = progress_bar(total=total, desc=desc, unit=unit, enabled=enabled and progress, initial=done)

    def update(self, values: dict[str, float]) -> None:
        """One step or epoch done; ``values`` are shown (4 significant digits) on the bar or the line."""
        self.done += 1
        shown = {k: f"{v:.4g}" if isinstance(v, float) else str(v) for k, v in values.items()}
        if self.bar.disable:
            if self.enabled and (self.done % self.every == 0 or self.done == self.total):
                fields = "  ".join(f"{k} {v}" for k, v in shown.items())
                print(f"{self.desc}: {self.unit} {self.done}/{self.total}  {fields}", file=self.stream, flush=True)
        else:
            self.bar.set_postfix(shown, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
