"""Checkpoints every trainer writes and reads, in global terms: a run saved at K ranks resumes at any K'.

::

    CHECKPOINT_DIR/
      step-00000040/           training done through step (or epoch) 40
        manifest.json          kind, step, the K that wrote it, the run's identity (and its digest: the run that
                               owns the folder), a size and CRC-32 per file, and where each piece of a table is
        state.pt               what every rank holds alike (rank 0 writes it): weights, optimizer state, progress
        rows-rank0.pt          rank 0's rectangles of sharded tables: (table, rows a..b, columns c..d) + their
        rows-rank1.pt          optimizer state, so that any plan can cut its own shards out of them
      step-00000050/
      .step-00000060.tmp/      being written: never read, removed by the next save

Nothing in a checkpoint is rank k's array: replicated state is saved once, and sharded rows are saved by table
and global row, so the next run re-cuts them for its own plan or partition.

Writing (``Checkpointer.save``): rank 0 makes the temporary folder; every rank writes its files and their
checksums; rank 0 writes the manifest, renames the folder into place, and keeps only the newest ``keep`` of its own.
A run writes only into a folder whose ``step-N`` folders are all its own (by their manifests, not their names);
another run's checkpoints, or a step folder without a manifest, are refused before anything is written. A
crash at any point leaves the earlier checkpoints whole. A rank that cannot write (a full disk) stops every rank:
after each step the ranks agree on whether one failed, and rank 0 removes the temporary folder.

Reading (``Checkpointer.load``): the newest checkpoint of ``--resume DIR`` (or, after a restart, of the run's own
``--checkpoint-dir``); each file's size and CRC-32 are checked before ``torch.load(weights_only=True)`` reads it
(no code in the file runs), and the run's identity (model, data, optimizer) is compared with the manifest's,
naming the first field that differs.

Fault injection for tests (``fail_at``, ``fail_rank``): that rank kills itself with SIGKILL when it reaches that
step, in the first attempt only, so a restarted run gets past it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist

from haloflow.engine.run_config import CheckpointConfig
from haloflow.errors import CheckpointError, ConfigError, DistributedError, HaloflowError, OutputError
from haloflow.utils.atomic import atomic_write_text, reporting_full_disk
from haloflow.utils.checksum import crc32_file

__all__ = ["CheckpointConfig", "Piece", "Checkpointer", "LoadedCheckpoint", "open_checkpoint", "newest",
           "restart_count", "cpu_state", "FORMAT"]

FORMAT = "haloflow-checkpoint/1"
RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"  # torchrun: 0 in the first attempt, n after n restarts
_STEP_DIR = re.compile(r"^step-(\d{8})$")

log = logging.getLogger(__name__)
T = TypeVar("T")


def cpu_state(state: dict) -> dict:
    """A state dict's tensors copied to the CPU (what a checkpoint or a result keeps)."""
    return {k: v.detach().cpu().clone() for k, v in state.items()}


def restart_count() -> int:
    """How many times torchrun has restarted this run's ranks (0 outside torchrun)."""
    try:
        return int(os.environ.get(RESTART_ENV, "0"))
    except ValueError:
        return 0


@dataclass
class Piece:
    """A rectangle of a table in global coordinates with its arrays: ``"weight"`` (rows, cols) and optimizer state
    ((rows, cols) elementwise, or (rows,) per row)."""

    table: int
    rows: tuple[int, int]
    cols: tuple[int, int]
    arrays: dict[str, torch.Tensor] = field(default_factory=dict)
    ids: torch.Tensor | None = None  # global row ids of scattered rows (e.g. a partition's nodes); then ``rows``
    # is only the table's whole range and the arrays' rows follow ``ids``


class LoadedCheckpoint:
    """A checkpoint read back and checked: ``step``, ``state`` (state.pt), and ``rows`` for sharded tables."""

    def __init__(self, path: Path, manifest: dict, state: dict):
        self.path = path
        self.manifest = manifest
        self.state = state
        self.step = int(manifest["step"])
        self._opened: dict[str, dict[str, torch.Tensor]] = {}

    def rows(self, table: int, rows: tuple[int, int], cols: tuple[int, int], name: str) -> torch.Tensor:
        """Array ``name`` of ``table`` over global ``rows`` x ``cols``, assembled from the pieces that overlap it
        (whatever plan wrote them). Per-row arrays (rows,) ignore ``cols``."""
        found = [p for p in self.manifest["pieces"] if p["table"] == table and p["name"] == name
                 and not p.get("ids_key") and p["rows"][0] < rows[1] and rows[0] < p["rows"][1]]
        if not found:
            raise CheckpointError(f"{self.path}: holds no {name!r} rows of table {table}")
        out, covered = None, None
        for p in found:
            data = self._open(p["file"])[p["key"]]
            lo, hi = max(rows[0], p["rows"][0]), min(rows[1], p["rows"][1])
            src = data[lo - p["rows"][0]: hi - p["rows"][0]]
            per_row = p["cols"] is None  # saved so exactly when the array is (rows,)
            if out is None:
                n, width = rows[1] - rows[0], 1 if per_row else cols[1] - cols[0]
                out = torch.empty((n,) if per_row else (n, width), dtype=data.dtype)
                covered = torch.zeros(n, width, dtype=torch.bool)
            if per_row:
                out[lo - rows[0]: hi - rows[0]] = src
                covered[lo - rows[0]: hi - rows[0]] = True
                continue
            c_lo, c_hi = max(cols[0], p["cols"][0]), min(cols[1], p["cols"][1])
            if c_lo >= c_hi:
                continue
            out[lo - rows[0]: hi - rows[0], c_lo - cols[0]: c_hi - cols[0]] = src[:, c_lo - p["cols"][0]: c_hi - p["cols"][0]]
            covered[lo - rows[0]: hi - rows[0], c_lo - cols[0]: c_hi - cols[0]] = True
        if not bool(covered.all()):
            raise CheckpointError(f"{self.path}: its pieces of table {table} do not cover rows {rows[0]}..{rows[1]} "
                                  f"x columns {cols[0]}..{cols[1]} of {name!r}")
        return out

    def rows_at(self, table: int, ids: torch.Tensor, name: str) -> torch.Tensor:
        """Array ``name`` of ``table`` at the global row ``ids`` (int64, distinct), from pieces saved with ``ids``
        (scattered rows: whichever rank owned them)."""
        ids = ids.cpu().long()
        found = [p for p in self.manifest["pieces"] if p["table"] == table and p["name"] == name
                 and p.get("ids_key")]
        if not found:
            raise CheckpointError(f"{self.path}: holds no {name!r} rows of table {table} by id")
        size = max([int(ids.max()) + 1 if ids.numel() else 0, *(p["rows"][1] for p in found)])
        where = torch.full((size,), -1, dtype=torch.int64)
        where[ids] = torch.arange(ids.numel())
        out, seen = None, torch.zeros(ids.numel(), dtype=torch.bool)
        for p in found:
            blob = self._open(p["file"])
            data, their_ids = blob[p["key"]], blob[p["ids_key"]]
            if out is None:
                out = torch.empty((ids.numel(), *data.shape[1:]), dtype=data.dtype)
            pos = where[their_ids]
            keep = pos >= 0
            out[pos[keep]] = data[keep]
            seen[pos[keep]] = True
        if not bool(seen.all()):
            missing = ids[~seen][:5].tolist()
            raise CheckpointError(f"{self.path}: has no {name!r} row of table {table} for ids {missing}")
        return out

    def digest(self, skip: tuple[str, ...] = ("rng",)) -> str:
        """SHA-256 of the trained state in global terms, whatever K wrote it: ``state`` (weights, optimizer state,
        histories; keys in ``skip`` left out) and every table array whole (rows by range assembled in global
        order, rows by id sorted by id). Two runs that trained the same floats give the same digest."""
        h = hashlib.sha256()
        _digest_into(h, {k: v for k, v in self.state.items() if k not in skip})
        for table, name in sorted({(p["table"], p["name"]) for p in self.manifest["pieces"]}):
            h.update(f"|table {table} {name}|".encode())
            by_id = [p for p in self.manifest["pieces"] if p["table"] == table and p["name"] == name
                     and p.get("ids_key")]
            if by_id:
                ids = torch.cat([self._open(p["file"])[p["ids_key"]] for p in by_id]).sort().values
                _digest_into(h, ids)
                _digest_into(h, self.rows_at(table, ids, name))
                continue
            ranged = [p for p in self.manifest["pieces"] if p["table"] == table and p["name"] == name]
            n = max(p["rows"][1] for p in ranged)
            width = max((p["cols"][1] for p in ranged if p["cols"] is not None), default=1)
            _digest_into(h, self.rows(table, (0, n), (0, width), name))
        return h.hexdigest()

    def has_rows(self, table: int, name: str) -> bool:
        return any(p["table"] == table and p["name"] == name for p in self.manifest["pieces"])

    def _open(self, name: str) -> dict[str, torch.Tensor]:
        if name not in self._opened:
            self._opened[name] = _load_checked(self.path, name, self.manifest, mmap=True)
        return self._opened[name]


class Checkpointer:
    """One run's checkpoints. ``kind`` ("gcn", "dlrm", ...) and ``identity`` (what must match to resume: model
    shape, data, optimizer) go into every manifest and are compared on load.

    ::

        ckpt = Checkpointer(config.runtime.checkpoint, layout, "gcn", identity)
        loaded = ckpt.load()                        # None: start fresh
        for step in range(loaded.step if loaded else 0, total):
            ckpt.maybe_fail(step)                   # the testing aid
            ...
            if ckpt.due(step + 1, total):
                ckpt.save(step + 1, state, pieces)  # collective: every rank calls it
    """

    def __init__(self, config: CheckpointConfig, layout, kind: str, identity: dict):
        self.config, self.layout, self.kind = config, layout, kind
        self.identity = json.loads(json.dumps(identity, default=str))  # as the manifest will read back
        if config.fail_at is not None and config.fail_rank >= layout.world_size:
            raise ConfigError(f"fail rank {config.fail_rank} is not one of the {layout.world_size} ranks",
                              field="fail_rank")
        self.source = self._source()
        # The newest checkpoint this run renamed into place (rank 0): set at the rename, the save's commit point, so
        # a Ctrl-C in the save's last collective still reports it (the save itself then never returns)
        self.published: Path | None = None

    # ------------------------------------------------------------------------------------------ reading
    def _source(self) -> Path | None:
        """The checkpoint to start from, or None. After a restart: the newest in the run's own dir (the run
        continues from where it died). Else ``resume``. A dir holding another run's checkpoints is refused."""
        cfg = self.config
        own = newest(cfg.dir) if cfg.dir is not None else None
        same = cfg.resume is not None and cfg.dir is not None and cfg.dir.resolve() in (
            cfg.resume.resolve(), cfg.resume.resolve().parent)
        if cfg.dir is not None and not same:  # (resuming its own folder: load names the field that differs)
            self._check_owned(cfg.dir)  # before anything is written or removed there
        if restart_count() > 0 and own is not None:
            return own
        if cfg.resume is not None:
            chosen = cfg.resume if (cfg.resume / "manifest.json").is_file() else newest(cfg.resume, checked=True)
            if chosen is None:
                raise CheckpointError(f"{cfg.resume}: holds no checkpoint (no manifest.json, no step-NNNNNNNN "
                                      "folder with one)")
            return chosen
        if own is not None and restart_count() == 0:
            raise CheckpointError(f"checkpoint dir {cfg.dir} already holds checkpoints (newest {own.name}); pass "
                                  f"--resume {cfg.dir} to continue that run, or choose an empty folder")
        return None

    def _check_owned(self, root: Path) -> None:
        """A run writes and rotates only in a folder whose ``step-N`` folders are all its own: each with a manifest
        naming this run (its family and identity). A step folder without a manifest (someone's own folder, or a
        copy cut short) or another run's checkpoints are refused with one line naming both runs; files of other
        names are never touched."""
        if not root.is_dir():
            return
        for step in sorted(p for p in root.iterdir() if _STEP_DIR.match(p.name)):
            try:
                manifest = _read_manifest(step)
            except CheckpointError as err:
                raise CheckpointError(f"checkpoint dir {root}: {step.name} is not a checkpoint of this run ({err}); "
                                      "this run writes only into an empty folder or its own: choose another "
                                      "--checkpoint-dir") from None
            if not self.owns(manifest):
                resumed = f", resuming {self.config.resume}" if self.config.resume is not None else ""
                raise CheckpointError(f"checkpoint dir {root} holds another run's checkpoints ({_run_name(manifest)}, "
                                      f"{step.name}); this run is {_run_name(self._manifest_run())}{resumed}: choose "
                                      "an empty --checkpoint-dir")

    def _manifest_run(self) -> dict:
        return {"kind": self.kind, "run": _run_record(self.kind, self.identity)}

    def owns(self, manifest: dict) -> bool:
        """Was the checkpoint of ``manifest`` written by this run (the same family and identity)?"""
        return (manifest.get("kind") == self.kind
                and _flat(manifest.get("identity") or {}) == _flat(self.identity))

    def resume(self, total: int, unit: str, flag: str, restore: Callable[[LoadedCheckpoint], T]) -> T | None:
        """Load the checkpoint to start from and hand it to ``restore`` (which puts its state in place and returns
        what the trainer needs); None when the run starts fresh. A checkpoint already at ``total`` (in ``unit``s)
        leaves nothing to train: an error naming ``flag``. State that does not fit the model: a CheckpointError."""
        loaded = self.load()
        if loaded is None:
            return None
        if loaded.step >= total:
            raise ConfigError(f"{loaded.path} is at {unit} {loaded.step}, and this run stops at {unit} {total}: "
                              f"nothing left to train; give more {flag}", field=flag.lstrip("-").replace("-", "_"))
        try:
            return restore(loaded)
        except HaloflowError:
            raise
        except (KeyError, TypeError, RuntimeError, ValueError) as err:
            raise CheckpointError(f"{loaded.path}: does not fit this model ({str(err).splitlines()[0][:200]})"
                                  ) from None

    def load(self) -> LoadedCheckpoint | None:
        """Read ``self.source`` (checked) on every rank; None when the run starts fresh."""
        if self.source is None:
            return None
        loaded = open_checkpoint(self.source)
        path, manifest = loaded.path, loaded.manifest
        if manifest.get("kind") != self.kind:
            raise CheckpointError(f"{path}: a checkpoint of a {manifest.get('kind')} run, but this run trains "
                                  f"{self.kind}")
        theirs, ours = _flat(manifest.get("identity", {})), _flat(self.identity)
        for key in sorted(set(theirs) | set(ours)):
            if theirs.get(key) != ours.get(key):
                raise CheckpointError(f"{path}: {key} differs: the checkpoint has {theirs.get(key)!r}, this run has "
                                      f"{ours.get(key)!r}")
        log.info("resuming from %s (step %s, written by %s ranks)", path, manifest["step"], manifest["world_size"])
        return loaded

    # ------------------------------------------------------------------------------------------ writing
    def due(self, done: int, total: int) -> bool:
        """Save after ``done`` steps? Every ``every``, and at the end of the run."""
        cfg = self.config
        return cfg.dir is not None and (done == total or (cfg.every > 0 and done % cfg.every == 0))

    def save(self, done: int, state: dict, pieces: Sequence[Piece] = ()) -> Path:
        """Write checkpoint ``done`` (a collective: every rank calls it). ``state`` is the same on every rank and
        rank 0 writes it; ``pieces`` are this rank's own rows. Returns the checkpoint folder.

        A rank that cannot write (a full disk: ``OutputError``) raises its error, and every other rank learns of
        it at the next step of the save and raises too, so the run stops with one line and no temporary folder,
        instead of training on without the checkpoint it was asked for."""
        lay, root = self.layout, self.config.dir
        final = root / f"step-{done:08d}"
        tmp = root / f".step-{done:08d}.tmp"
        try:
            self._save_stages(done, state, pieces, tmp, final)
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C, torchrun's SIGTERM: no half-written folder stays
            if lay.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final

    def _save_stages(self, done: int, state: dict, pieces: Sequence[Piece], tmp: Path, final: Path) -> None:
        lay, root = self.layout, self.config.dir
        failed = None
        if lay.is_main:
            try:
                with reporting_full_disk(tmp, root):
                    root.mkdir(parents=True, exist_ok=True)
                    for stale in root.glob(".step-*.tmp"):
                        shutil.rmtree(stale, ignore_errors=True)
                    tmp.mkdir()
            except Exception as err:
                failed = _naming(err, final)
        self._agree(failed, tmp, f"checkpoint {done}: making its folder")
        try:
            self._write_files(tmp, state, pieces)
        except Exception as err:
            failed = _naming(err, final)
        self._agree(failed, tmp, f"checkpoint {done}: writing its files")
        if lay.is_main:
            try:
                self._publish(tmp, final, done)
            except Exception as err:
                failed = _naming(err, final)
        self._agree(failed, tmp, f"checkpoint {done}: renaming it into place")

    def _write_files(self, tmp: Path, state: dict, pieces: Sequence[Piece]) -> None:
        """This rank's files in ``tmp``, and ``files-rank<r>.json`` listing them and the pieces they hold."""
        lay = self.layout
        files, index = {}, []
        if lay.is_main:
            files["state.pt"] = _save(tmp / "state.pt", state)
        if pieces:
            name = f"rows-rank{lay.rank}.pt"
            blob = {}
            for i, p in enumerate(pieces):
                ids_key = None
                if p.ids is not None:
                    ids_key = f"{i}.ids"
                    blob[ids_key] = p.ids.detach().cpu().long().contiguous().clone()
                for arr_name, arr in p.arrays.items():
                    key = f"{i}.{arr_name}"
                    blob[key] = arr.detach().cpu().contiguous().clone()  # a view would save its whole storage
                    index.append({"file": name, "key": key, "table": int(p.table), "name": arr_name,
                                  "rows": [int(p.rows[0]), int(p.rows[1])], "ids_key": ids_key,
                                  "cols": None if arr.dim() == 1 else [int(p.cols[0]), int(p.cols[1])]})
            files[name] = _save(tmp / name, blob)
        atomic_write_text(tmp / f"files-rank{lay.rank}.json", json.dumps({"files": files, "pieces": index}))

    def _publish(self, tmp: Path, final: Path, done: int) -> None:
        """Rank 0, once every rank's files are in ``tmp``: the manifest, the rename, and the pruning to ``keep``."""
        lay, root = self.layout, self.config.dir
        all_files, all_pieces = {}, []
        for r in range(lay.world_size):
            part = tmp / f"files-rank{r}.json"
            got = json.loads(part.read_text())
            all_files.update(got["files"])
            all_pieces += got["pieces"]
            part.unlink()
        manifest = {"format": FORMAT, "kind": self.kind, "run": _run_record(self.kind, self.identity), "step": done,
                    "world_size": lay.world_size, "identity": self.identity, "files": all_files, "pieces": all_pieces}
        atomic_write_text(tmp / "manifest.json", json.dumps(manifest, indent=1))
        if final.exists():  # the same step saved again (a resumed run passing it): the new one wins, if it is ours
            self._check_owned(root)  # again: a folder may have appeared there while the run trained
            shutil.rmtree(final)
        os.replace(tmp, final)
        self.published = final
        ours = sorted(p for p in root.iterdir() if _STEP_DIR.match(p.name) and self._is_ours(p))
        for old in ours[:-self.config.keep]:  # only this run's checkpoints: any other folder stays
            shutil.rmtree(old, ignore_errors=True)

    def _is_ours(self, step: Path) -> bool:
        try:
            return self.owns(_read_manifest(step))
        except CheckpointError:
            return False

    def _agree(self, error: Exception | None, tmp: Path, what: str) -> None:
        """Where every rank learns whether any rank failed (a barrier that carries one number: the lowest failed
        rank). On a failure rank 0 removes ``tmp`` (every rank is done writing there), the failed ranks raise
        their own error and the others a ``DistributedError`` naming the first failed rank."""
        lay = self.layout
        first = lay.rank if error is not None else lay.world_size
        if lay.group is not None:
            device = lay.device if lay.backend == "nccl" else torch.device("cpu")
            flag = torch.tensor([first], dtype=torch.int64, device=device)
            try:
                dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=lay.group)
            except RuntimeError as err:
                from haloflow.engine.comm import peer_note

                raise DistributedError(f"rank {lay.rank}: {what} failed - {peer_note()} "
                                       f"({str(err).splitlines()[0][:300]})") from err
            first = int(flag.item())  # waits for the reduction
        if first == lay.world_size:
            return
        if lay.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        if error is not None:
            raise error
        raise DistributedError(f"rank {lay.rank}: {what} failed on rank {first} (its error says why); this "
                               "checkpoint is not written")

    def maybe_fail(self, step: int) -> None:
        """The testing aid: die here, as ``kill -9`` would, if this is the rank and the step (counted from 1)."""
        cfg = self.config
        if (cfg.fail_at is not None and step == cfg.fail_at and self.layout.rank == cfg.fail_rank
                and restart_count() == 0):
            print(f"rank {self.layout.rank}: --fail-at {step}: killing this rank (a testing aid)", file=sys.stderr,
                  flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


def _digest_into(h, value) -> None:
    """Feed ``value`` (tensors, numbers, strings, lists and dicts of them, dict keys sorted) into hash ``h``."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            h.update(f"K{k}".encode())
            _digest_into(h, value[k])
    elif isinstance(value, (list, tuple)):
        h.update(f"L{len(value)}".encode())
        for v in value:
            _digest_into(h, v)
    else:
        h.update(f"V{value!r}".encode())


def open_checkpoint(path: str | os.PathLike) -> LoadedCheckpoint:
    """Read a checkpoint folder, or the newest checkpoint under a checkpoint dir: manifest and state.pt checked
    (sizes, CRC-32) and read without running code from them; the rows files are checked when first read."""
    path = Path(path)
    if not (path / "manifest.json").is_file():
        found = newest(path, checked=True)
        if found is None:
            raise CheckpointError(f"{path}: holds no checkpoint (no manifest.json, no step-NNNNNNNN folder with one)")
        path = found
    manifest = _read_manifest(path)
    return LoadedCheckpoint(path, manifest, _load_checked(path, "state.pt", manifest))


def _flat(identity: dict, prefix: str = "") -> dict:
    """``{"model": {"hidden_dim": 16}}`` -> ``{"model.hidden_dim": 16}``, so a mismatch names the inner field."""
    out = {}
    for key, value in identity.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def newest(root: Path, *, checked: bool = False) -> Path | None:
    """The checkpoint folder with the highest step under ``root`` (None when there is none).

    ``checked``: a step folder without a manifest above the newest one with one is an error, not skipped: resuming
    from the older one would quietly lose the units between them."""
    if not root.is_dir():
        return None
    steps = sorted(p for p in root.iterdir() if _STEP_DIR.match(p.name))
    whole = [p for p in steps if (p / "manifest.json").is_file()]
    if checked and steps and (not whole or steps[-1] != whole[-1]):
        older = f"; resume from {whole[-1]} itself to go on from there" if whole else ""
        raise CheckpointError(f"{steps[-1]}: no manifest.json (damaged, or a copy cut short), and it is newer than "
                              f"every whole checkpoint in {root}{older}")
    return whole[-1] if whole else None


def _run_record(kind: str, identity: dict) -> dict:
    """What a manifest says about the run that wrote it: its family and a digest of its identity (model, data,
    optimizer), so that two runs' folders can be told apart at a glance."""
    text = json.dumps(identity, sort_keys=True, default=str)
    return {"family": kind, "digest": hashlib.sha256(text.encode()).hexdigest()[:16]}


def _run_name(manifest: dict) -> str:
    run = manifest.get("run") if isinstance(manifest.get("run"), dict) else {}
    digest = run.get("digest") or _run_record(str(manifest.get("kind")), manifest.get("identity") or {})["digest"]
    return f"a {manifest.get('kind')} run, config digest {digest}"


def _naming(err: Exception, final: Path) -> Exception:
    """A full disk's ``OutputError`` names the checkpoint (not the temporary file that is about to go)."""
    if isinstance(err, OutputError):
        return OutputError(final, f"{err.reason}; this checkpoint is not written", errno=err.errno)
    return err


def _save(path: Path, payload: dict) -> dict:
    with reporting_full_disk(path), open(path, "wb") as f:  # a Python file: a full disk raises its ENOSPC
        torch.save(payload, f)
    return {"bytes": path.stat().st_size, "crc32": crc32_file(path)}


def _read_manifest(path: Path) -> dict:
    file = path / "manifest.json"
    try:
        manifest = json.loads(file.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: not a checkpoint (no manifest.json)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{file}: unreadable ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{file}: not a {FORMAT} manifest (format {manifest.get('format') if isinstance(manifest, dict) else None!r})")
    for key, kind in (("step", int), ("world_size", int), ("files", dict), ("pieces", list), ("identity", dict)):
        if not isinstance(manifest.get(key), kind):
            raise CheckpointError(f"{file}: field {key!r} missing or not {kind.__name__}")
    return manifest


def _load_checked(path: Path, name: str, manifest: dict, *, mmap: bool = False) -> dict:
    """``torch.load(weights_only=True)`` of one file after its size and CRC-32 match the manifest."""
    info = manifest["files"].get(name)
    file = path / name
    if not isinstance(info, dict):
        raise CheckpointError(f"{path}/manifest.json: lists no file {name}")
    if not file.is_file():
        raise CheckpointError(f"{file}: missing (the manifest lists it)")
    size = file.stat().st_size
    if size != info.get("bytes"):
        raise CheckpointError(f"{file}: {size} bytes, the manifest says {info.get('bytes')} (truncated or replaced)")
    crc = crc32_file(file)
    if crc != info.get("crc32"):
        raise CheckpointError(f"{file}: CRC-32 {crc:#010x}, the manifest says {info.get('crc32')} (the file is "
                              "damaged)")
    try:
        data = torch.load(file, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as err:  # pickle or zip errors of a file whose checksum matched: written by something else
        raise CheckpointError(f"{file}: not readable as a checkpoint ({type(err).__name__}: "
                              f"{str(err).splitlines()[0][:200]})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{file}: holds a {type(data).__name__}, expected a dict")
    return data
