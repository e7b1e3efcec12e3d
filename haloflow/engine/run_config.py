"""The configs every trainer shares, with no torch in reach: the launcher (``haloflow train MODEL --nproc K``)
parses and checks a command line with them before any process starts, and pays for torch's import only in the
ranks (``tests/cli/test_runtime_args.py`` holds it to that).

::

    RuntimeConfig         --device, --timeout, --log-jsonl, progress, --fixed-threads   (engine/runtime.py runs it)
      CheckpointConfig    --checkpoint-dir/-every/-keep, --resume, --fail-at            (engine/checkpoint.py)
    GradSyncConfig        --bucket-bytes: the weight-gradient buckets                   (engine/grad_sync.py)
    SCHEDULES             "overlap" or its control "wait_first" (GCN's halos, TGN's rows)
    expect_parts          the one check of a partition's or plan's K against the number of processes
    expect_hosts          the launcher's check of V logical workers on K processes (``engine/logical.py``'s rule)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from haloflow.errors import ConfigError
from haloflow.utils.atomic import check_file_replaceable
from haloflow.utils.config_flags import hidden, nested, option
from haloflow.utils.owned import jsonl_log

__all__ = ["DEVICES", "SCHEDULES", "MAX_UNITS", "check_units", "expect_parts", "expect_hosts", "CheckpointConfig",
           "RuntimeConfig", "GradSyncConfig"]

DEVICES = ("auto", "cpu", "cuda")
SCHEDULES = ("overlap", "wait_first")  # the exchange overlapped with compute, or the control that waits first


# More epochs, steps or batches than any run could finish (a billion units of even a millisecond each is 12 days):
# a typo (--epochs 100000000000000000000), refused before any work instead of a run that never ends.
MAX_UNITS = 10**9


def check_units(value: int | None, name: str) -> None:
    """Refuse a count of units past ``MAX_UNITS`` (``name``: the config field, which the CLI maps to its flag)."""
    if value is not None and value > MAX_UNITS:
        raise ConfigError(f"{name} must be <= {MAX_UNITS:,} (more than a run could finish), got {value:,}", field=name)


def expect_parts(parts: int, world_size: int, source: str) -> None:
    """The one check of a partition's or plan's K against the number of processes, with the fix in the message."""
    if parts != world_size:
        raise ConfigError(
            f"{source} has {parts} parts but {world_size} process{'es' if world_size > 1 else ''} "
            f"run: start {parts} (--nproc {parts}, or torchrun --nproc-per-node {parts})", field="nproc")


def expect_hosts(v: int, world_size: int, source: str) -> None:
    """V logical ranks (a folder's parts, a plan's ranks) on ``world_size`` processes: K must divide V with a power
    of two per rank (``engine/logical.LogicalWorkers`` holds the ranks to it; this is the launcher's check, without
    torch)."""
    per = v // world_size if world_size > 0 else 0
    if world_size < 1 or v % world_size or per & (per - 1):
        fits = [k for k in range(1, v + 1) if v % k == 0 and not (v // k) & (v // k - 1)]
        raise ConfigError(f"{source} has {v} parts, which {world_size} process{'es' if world_size > 1 else ''} "
                          f"cannot host: each hosts V / K parts, a power of two (for V = {v}: --nproc in {fits})",
                          field="nproc")


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Where and how often a run saves itself, where it resumes from, and (for tests) where it crashes.

    Args:
        dir: write checkpoints here (``--checkpoint-dir``); None: none are written.
        every: save after every this many units (GCN epochs, DLRM steps, TGN batches), and always at the end; 0: at
            the end only.
        keep: how many of the newest checkpoints to keep.
        resume: start from a checkpoint (``--resume``): a checkpoint folder, or a checkpoint dir (its newest).
        fail_at / fail_rank: a testing aid: rank ``fail_rank`` kills itself (SIGKILL) on reaching step or epoch
            ``fail_at`` (counted from 1), in the first attempt only.
    """

    dir: Path | None = option(None, "--checkpoint-dir", metavar="DIR", help="save checkpoints here (model, "
                              "optimizer, RNG, position; in global terms, so any number of ranks can resume them)")
    every: int = option(0, "--checkpoint-every", metavar="N", means="at the end only",
                        help="save every N units: epochs (GCN), steps (DLRM) or batches (TGN); and at the end")
    keep: int = option(2, "--checkpoint-keep", metavar="M", help="keep the newest M")
    resume: Path | None = option(None, metavar="DIR", help="continue from the newest checkpoint in DIR (or from "
                                 "the checkpoint folder DIR), at any number of ranks")
    fail_at: int | None = option(None, metavar="STEP", help="testing aid: rank --fail-rank kills itself (SIGKILL) "
                                 "on reaching epoch or step STEP (from 1), in the first attempt only")
    fail_rank: int = option(0, metavar="R", help="the rank --fail-at kills")

    def __post_init__(self) -> None:
        for name in ("dir", "resume"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        if self.every < 0:
            raise ConfigError(f"checkpoint every must be >= 0, got {self.every}", field="every")
        if self.keep < 1:
            raise ConfigError(f"checkpoint keep must be >= 1, got {self.keep}", field="keep")
        if self.every and self.dir is None:
            raise ConfigError("checkpoint every needs a checkpoint dir to write to", field="dir")
        if self.dir is not None and self.dir.exists() and not self.dir.is_dir():
            raise ConfigError(f"checkpoint dir {self.dir} is a file; expected a folder", field="dir")
        if self.resume is not None and not self.resume.is_dir():
            raise ConfigError(f"{self.resume}: no such checkpoint folder", field="resume")
        if self.fail_at is not None and self.fail_at < 1:
            raise ConfigError(f"fail at must be >= 1, got {self.fail_at}", field="fail_at")
        if self.fail_rank < 0:
            raise ConfigError(f"fail rank must be >= 0, got {self.fail_rank}", field="fail_rank")


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    """What every trainer shares: where it runs, how long a peer may be silent, and what it reports.

    Args:
        device: "auto" (CUDA when present, else CPU), "cpu" or "cuda"; rank r uses CUDA device LOCAL_RANK.
        timeout_s: how long a collective waits for a peer before raising (a dead rank is an error, not a hang).
        log_jsonl: rank 0 writes JSON lines here (``--log-jsonl``): one per epoch (GCN, TGN), one every
            ``log_every`` steps (DLRM: every 100 when 0) and a summary, each flushed as it comes (``tail -f``
            follows it; a failed run keeps the lines so far). A new run truncates an existing file; an attempt
            that torchrun restarted (``--max-restarts``) appends to it. A FIFO or a device is written through.
        progress: a progress bar when stderr is a terminal, else a line every ``log_every`` units; False: neither
            (warnings and the summary still show).
        log_every: without a bar, print a line every this many epochs, steps or batches (0: about ten lines a
            run); DLRM writes its JSON train record every this many steps too (0: every 100).
        checkpoint: where and how often to save, and where to resume from (``engine/checkpoint.py``).
        adapt_threads: between units, use fewer threads while other processes keep the cores busy, and go back
            up when they leave (``host/threads.ThreadGovernor``; ``--fixed-threads`` turns it off). On only where
            the numbers do not depend on the thread count (MKL in its reproducible mode, set at start-up), so a
            run is the same bit for bit whatever else runs beside it, and at any OMP_NUM_THREADS. Fixed threads
            leave MKL its fastest split (up to ~10% faster on small-output products; the numbers then differ from
            the default run's in the last bits).
        allow_nonfinite: a loss that is NaN or infinite stops the run at that unit (``RunFailed``: exit 1), naming
            the unit, the loss and the last good checkpoint; True: train on (``--allow-nonfinite``).
        overwrite: an output file that is already there is replaced only when haloflow wrote it (a JSON log whose
            lines are our records, a model file of ours); True replaces any regular file. Links, FIFOs and
            devices are written through either way.
    """

    device: str = option("auto", choices=DEVICES, means="CUDA when present",
                         help="where each rank computes (rank r uses GPU LOCAL_RANK)")
    timeout_s: float = option(120.0, "--timeout", metavar="S",
                              help="seconds a rank waits for a silent peer before failing")
    log_jsonl: str | Path | None = option(None, metavar="FILE",
                                          help="rank 0 writes JSON lines: one per epoch (GCN, TGN) or per "
                                          "--log-every steps (DLRM), and a summary")
    progress: bool = option(True, "--no-progress", negate=True,
                            help="no progress bar or progress lines (warnings and the summary still print)")
    log_every: int = option(0, metavar="N", means="about ten lines a run; DLRM's JSON record every 100 steps",
                            help="without a progress bar, print a line every N epochs, steps or batches (DLRM: "
                            "also its JSON train record)")
    checkpoint: CheckpointConfig = nested(CheckpointConfig, "checkpoints and recovery")
    adapt_threads: bool = option(True, "--fixed-threads", negate=True,
                                 help="keep the thread count fixed, also while other processes keep the cores busy")
    allow_nonfinite: bool = option(False, help="keep training after a loss that is NaN or infinite (default: the "
                                   "run stops at that unit with exit status 1)")
    overwrite: bool = option(False, help="replace output files (--log-jsonl, --save) that are already there and "
                             "were not written by haloflow (default: refused; haloflow's own are replaced)")

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ConfigError(f"device must be one of {DEVICES}, got {self.device!r}", field="device")
        if not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise ConfigError(f"timeout_s must be a finite number > 0, got {self.timeout_s}", field="timeout_s")
        if self.log_every < 0:
            raise ConfigError(f"log_every must be >= 0, got {self.log_every}", field="log_every")
        if self.log_jsonl is not None:
            path = Path(self.log_jsonl)
            object.__setattr__(self, "log_jsonl", path)
            if path.is_dir():  # found now, not after training
                raise ConfigError(f"log_jsonl {path} is a folder; expected a file name to write", field="log_jsonl")
            check_file_replaceable(path, self.overwrite, jsonl_log, "--log-jsonl")


@dataclass(frozen=True, kw_only=True)
class GradSyncConfig:
    """Args:
        bucket_bytes: largest bucket; 1 MiB keeps a few buckets for GCN-sized weights, so the first can fly
            while backward computes the rest (DDP's 25 MiB default would put all of GCN in one bucket).
        min_buckets: cut the weights into at least this many buckets where parameters allow (a lone parameter
            is never split): with one bucket, nothing would launch before backward ends.
    """

    bucket_bytes: int = option(1 << 20, help="largest weight-gradient bucket")
    min_buckets: int = hidden(2, why="a property of the overlap, not of a run")

    def __post_init__(self) -> None:
        if self.bucket_bytes <= 0:
            raise ConfigError(f"bucket_bytes must be > 0, got {self.bucket_bytes}", field="bucket_bytes")
        if self.min_buckets < 1:
            raise ConfigError(f"min_buckets must be >= 1, got {self.min_buckets}", field="min_buckets")
