"""The one training loop: ``run(family, runtime_config)`` trains any model family, at any K.

A family (GCN, DLRM, TGN, or a new one) says what it is and how to train one unit; the loop owns everything
else, once for every family::

    Runtime.start                     join torchrun's group (or run alone), device, metrics log
      family.setup(rt)                data, model, optimizer, the distributed transforms (K = 1: a group of one)
      ckpt.resume -> family.restore   weights, optimizer, history, rows (in global terms) + the RNG, by the loop
      after a restart                 a warning, and the metrics log continued (units past the checkpoint dropped)
      family.begin(done)              position the data where the run (or the checkpoint) stands
      rt.started()                    start-up ends here
      for unit in done .. total-1:
          ckpt.maybe_fail(unit + 1)   the fault point (testing aid)
          m = family.train_unit(unit) one epoch / step / batch, every rank together -> a typed record
          rt.between_units()          fewer threads while other processes hold the cores (--fixed-threads: not)
          metrics log <- m.record()   a JSON line when the family has one for this unit (+ attempt, units done)
          progress    <- m.progress() the bar or a printed line (rank 0)
          a NaN / inf loss            RunFailed (exit 1), naming the unit and the last checkpoint
          ckpt.due -> ckpt.save(family.export() + the RNG)
      family.finish()                 in-flight work, final files of its own (e.g. --save)
      final = family.evaluate(run)    the family's final metrics (collective), throughput in its own terms
      metrics log <- summary          one schema for every family (``SUMMARY_KEYS``)
      family.result(run, final)       the family's TrainResult, the same on every rank

A family never calls the checkpointer's ``save`` / ``due`` or the reporter itself, so a fourth family is one
file that implements ``Family`` and one line in ``engine/families.py``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from haloflow.engine.checkpoint import LoadedCheckpoint, Piece, restart_count
from haloflow.engine.runtime import Runtime, RuntimeConfig, TrainResult, synchronize
from haloflow.errors import ConfigError, RunFailed

__all__ = ["Family", "UnitMetrics", "Exported", "RunInfo", "SUMMARY_KEYS", "run", "Interrupted"]

log = logging.getLogger(__name__)

# The last JSON record of every run, whatever the family: these keys, the family's own in "metrics".
SUMMARY_KEYS = ("kind", "family", "unit", "units", "units_trained", "units_per_s", "resumed_at", "startup_s",
                "train_s", "world_size", "logical_workers", "threads_per_rank", "device", "metrics")


@runtime_checkable
class UnitMetrics(Protocol):
    """What one unit of training returns: a typed record that knows how it is shown and logged."""

    def progress(self) -> dict[str, float]:
        """A few values for the progress bar or the printed line (rank 0)."""
        ...

    def record(self) -> dict | None:
        """The JSON line for this unit (with its own "kind"), or None when this unit logs nothing."""
        ...


@dataclass(frozen=True)
class Exported:
    """A family's state for a checkpoint, in global terms: ``state`` is the same on every rank (rank 0 writes
    it); ``pieces`` are this rank's own rows (table rectangles, or rows keyed by global id)."""

    state: dict
    pieces: tuple[Piece, ...] = ()


@dataclass(frozen=True)
class RunInfo:
    """How the loop ran, handed to ``Family.result``."""

    rt: Runtime
    total: int  # units the run reaches
    resumed_at: int  # units the checkpoint had done
    train_s: float

    @property
    def trained(self) -> int:
        return self.total - self.resumed_at

    def base(self) -> dict[str, Any]:
        """The fields every ``TrainResult`` has, as keyword arguments."""
        rt = self.rt
        return {"layout": rt.layout, "startup_s": rt.startup_s, "train_s": self.train_s, "threads": rt.threads,
                "records": rt.metrics.records}


class Family(Protocol):
    """One model family, as the loop sees it. Attributes:

    kind: "gcn": the checkpoint kind and the summary's family.
    unit: "epoch", "step" or "batch": what ``train_unit`` trains.
    more_flag: the flag that trains more units ("--epochs"), named when a checkpoint leaves nothing to train.
    join: whether the run joins torchrun's group (False: this process alone, e.g. GCN on a whole data set).
    adapts_threads: whether the thread count may follow the free cores between units (False: it stays as it
        started, for a family whose results round by the thread count).
    """

    kind: str
    unit: str
    more_flag: str
    join: bool
    adapts_threads: bool

    def setup(self, rt: Runtime) -> None:
        """Build data, model and optimizer on ``rt`` (its layout, device and group); every rank together."""
        ...

    def total_units(self) -> int:
        """Units the run trains in all (those a resumed checkpoint did included)."""
        ...

    def identity(self) -> dict:
        """What a checkpoint must match to be resumed (model shape, data sizes, optimizer)."""
        ...

    def export(self) -> Exported:
        """The state to checkpoint (the RNG is the loop's)."""
        ...

    def restore(self, loaded: LoadedCheckpoint) -> None:
        """Put a checkpoint's state in place (weights, optimizer, history, this rank's rows)."""
        ...

    def begin(self, done: int) -> None:
        """Called once before the first unit, with the units already done (data position, precomputation)."""
        ...

    def train_unit(self, index: int) -> UnitMetrics:
        """Train unit ``index`` (0-based, global over the run); every rank calls it together."""
        ...

    def finish(self) -> None:
        """After the last unit: wait for work in flight, write the family's own outputs."""
        ...

    def evaluate(self, run: RunInfo) -> dict[str, float]:
        """The final metrics (a collective), given how the loop ran (``run.train_s``: for samples / s and the
        like); {} when the family has none."""
        ...

    def result(self, run: RunInfo, metrics: dict[str, float]) -> TrainResult:
        """The family's result object, the same on every rank."""
        ...


def run(family: Family, runtime: RuntimeConfig) -> TrainResult:
    """Train ``family`` as ``runtime`` says (group, device, output, checkpoints); see the module docstring.

    Raises:
        ConfigError: a setting the run cannot use, or a checkpoint that leaves nothing to train.
        CheckpointError: a checkpoint that does not belong to this run.
        DistributedError: a peer died or timed out.
    """
    with Runtime.start(runtime, join=family.join) as rt:
        _setup(family, rt)
        total = family.total_units()
        ckpt = rt.checkpointer(family.kind, family.identity())
        done = ckpt.resume(total, family.unit, family.more_flag, lambda loaded: _restore(family, loaded)) or 0
        attempt = restart_count()
        if attempt > 0:  # torchrun restarted every rank (--max-restarts): say so, and continue the log
            rt.metrics.after_restart(done, attempt)
            if rt.layout.is_main:
                log.warning("restart %d: every rank restarted; continuing from %s %d (the last checkpoint)",
                            attempt, family.unit, done)
        family.begin(done)
        rt.started()
        train_s = _loop(family, rt, ckpt, done, total, attempt)
        family.finish()
        info = RunInfo(rt=rt, total=total, resumed_at=done, train_s=train_s)
        metrics = family.evaluate(info)
        rt.metrics.write(_summary(family, info, metrics))
        log.info("trained %s for %d %ss on %s", family.kind, info.trained, family.unit, rt.describe())
        return family.result(info, metrics)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during the units: the unit it stopped (counted from 1) and the newest checkpoint this run saved or
    resumed from (None: none), so that the CLI's one line says where to resume from."""

    def __init__(self, unit: str, at: int, checkpoint: Path | None):
        where = f"; last checkpoint: {checkpoint}" if checkpoint is not None else ""
        super().__init__(f"interrupted at {unit} {at}{where}")
        self.unit, self.at, self.checkpoint = unit, at, checkpoint


def _setup(family: Family, rt: Runtime) -> None:
    """``family.setup``, with a model or data larger than this machine's memory (``--memory-dim 100000000``) said in
    one line, not a traceback from the allocator."""
    try:
        family.setup(rt)
    except (MemoryError, torch.OutOfMemoryError, RuntimeError) as err:
        text = str(err).splitlines()[0] if str(err) else type(err).__name__
        if not isinstance(err, MemoryError) and "allocate" not in text and not isinstance(err, torch.OutOfMemoryError):
            raise
        raise ConfigError(f"{family.kind}: the model and data do not fit in this machine's memory ({text[:160]}); "
                          "choose smaller sizes (dims, hidden width, tables)") from None


def _restore(family: Family, loaded: LoadedCheckpoint) -> int:
    family.restore(loaded)
    torch.set_rng_state(loaded.state["rng"])
    return loaded.step


def _loop(family: Family, rt: Runtime, ckpt, done: int, total: int, attempt: int) -> float:
    """Units ``done`` .. ``total - 1``, with the fault, log, progress and save points; returns the seconds."""
    lay = rt.layout
    reporter = rt.reporter(total=total, unit=family.unit, desc=f"train {family.kind} (K={lay.world_size})",
                           done=done)
    t0 = time.perf_counter()
    at, last = done + 1, ckpt.source  # for Interrupted: the unit in progress, the newest checkpoint
    try:
        for index in range(done, total):
            at = index + 1
            ckpt.maybe_fail(index + 1)
            metrics = family.train_unit(index)
            if family.adapts_threads:
                rt.between_units()  # the thread count follows the free cores (unless --fixed-threads)
            record = metrics.record()
            if record is not None:  # which attempt wrote it, and the units done then (a restart keeps those
                rt.metrics.write({**record, "attempt": attempt, "units_done": index + 1})  # its checkpoint holds)
            shown = metrics.progress()
            reporter.update(shown)
            _check_finite(family, rt, index + 1, shown.get("loss"), ckpt.published or last)
            if ckpt.due(index + 1, total):
                exported = family.export()
                last = ckpt.save(index + 1, {**exported.state, "rng": torch.get_rng_state()}, exported.pieces)
    except KeyboardInterrupt:  # Ctrl-C, or the launcher passing it on: say where the run stood
        raise Interrupted(family.unit, at, ckpt.published or last) from None
    finally:
        reporter.close()
    synchronize(lay.device)  # the clock reads the device's finished work
    return time.perf_counter() - t0


def _check_finite(family: Family, rt: Runtime, at: int, loss: float | None, checkpoint: Path | None) -> None:
    """Stop the run at the first unit whose loss is NaN or infinite (the loss a unit reports is global, so every
    rank stops at the same unit), unless ``--allow-nonfinite``: weights past it are garbage, and a run that goes
    on would end with exit 0 and a NaN model."""
    if loss is None or math.isfinite(loss) or rt.config.allow_nonfinite:
        return
    where = f"the last good checkpoint is {checkpoint}" if checkpoint is not None else "no checkpoint was written"
    raise RunFailed(f"{family.kind}: the loss at {family.unit} {at} is {loss} (not a finite number); the run "
                    f"stopped there and {where} (a smaller --lr, or --allow-nonfinite to train on)")


def _summary(family: Family, info: RunInfo, metrics: dict[str, float]) -> dict:
    rt = info.rt
    record = {"kind": "summary", "family": family.kind, "unit": family.unit, "units": info.total,
              "units_trained": info.trained,
              "units_per_s": info.trained / info.train_s if info.train_s > 0 else 0.0,
              "resumed_at": info.resumed_at, "startup_s": rt.startup_s, "train_s": info.train_s,
              "world_size": rt.layout.world_size,
              # V: the run's floats depend on it, not on K (a family without logical workers: V = K)
              "logical_workers": getattr(family, "logical_workers", None) or rt.layout.world_size,
              "threads_per_rank": rt.threads, "device": str(rt.layout.device),
              "metrics": dict(metrics)}
    assert tuple(record) == SUMMARY_KEYS  # one schema: a new key goes into SUMMARY_KEYS too
    return record
