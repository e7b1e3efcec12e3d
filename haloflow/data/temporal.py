"""Event streams for temporal GNNs: `TemporalEvents`, readers, the chronological and inductive splits.

An event stream is a time-ordered list of interactions ``(src, dst, t)`` with an optional label and edge
features; event ids are positions in the stream::

    event id   0     1     2     3     4          t never decreases; equal times keep file order
    src        0     1     0     2     1
    dst        3     3     4     3     4          one id space 0..num_nodes-1 (JODIE items are offset)
    t          0    36    36    77   120          int64 when every time is a whole number, else float64
    label      0     0     0     1     0          float32 (optional)
    edge_feat  [F]   [F]   [F]   [F]   [F]        float32 (E, F) (optional)

    chronological_split (70/15/15 by default; events sharing a timestamp stay on one side of a cut)
               |<------ train ------>|<- val ->|<- test ->|
               0                 train_end  val_end       E

JODIE CSV (``read_jodie_csv``), the header says which of two layouts a file has::

    u,i,ts,label[,f0,f1,...]          ids already in one space (the layout of ../shared/data/temporal)
    0,8227,0,0
    user_id,item_id,timestamp,state_label,comma_separated_list_of_features     original JODIE: users and items
    0,0,0.0,0,0.1,-0.2,...                                                     numbered apart; items become
                                                                               num_users + item_id

SNAP temporal edge list (``read_snap_temporal``): ``src dst unix_time`` per line, tabs or spaces, ``#`` or ``%``
comment lines, plain or compressed (gzip / xz / bz2, recognised by the magic bytes).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from haloflow.data.graph import max_plausible_nodes
from haloflow.data.textscan import (BLOCK_BYTES, arrow_threads, codec_errors, first_problem, iter_token_blocks,
                                    open_decompressed)
from haloflow.errors import ConfigError, InputFormatError

__all__ = [
    "TemporalEvents",
    "read_jodie_csv",
    "read_snap_temporal",
    "TemporalSplit",
    "chronological_split",
    "InductiveSplit",
    "inductive_nodes",
]

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------- the stream
@dataclass(frozen=True, eq=False, kw_only=True)
class TemporalEvents:
    """A time-ordered stream of events (layout in the module docstring).

    Arrays are converted on construction (ids to int64, labels and features to float32, times to int64 if
    integral else float64) and checked: equal lengths, ids in ``[0, num_nodes)``, times that never decrease.

    Shapes:
        src, dst int64 (E,);  t int64 or float64 (E,);  label float32 (E,) or None;
        edge_feat float32 (E, F) or None.
    """

    src: np.ndarray
    dst: np.ndarray
    t: np.ndarray
    num_nodes: int
    label: np.ndarray | None = None
    edge_feat: np.ndarray | None = None

    def __post_init__(self) -> None:
        src = np.ascontiguousarray(self.src, dtype=np.int64)
        dst = np.ascontiguousarray(self.dst, dtype=np.int64)
        t = np.asarray(self.t)
        t = np.ascontiguousarray(t, dtype=np.int64 if t.dtype.kind in "iub" else np.float64)
        e = src.shape[0]
        for name, a in (("src", src), ("dst", dst), ("t", t)):
            if a.shape != (e,):
                raise ConfigError(f"TemporalEvents.{name} must have shape ({e},) like src, got {a.shape}")
        object.__setattr__(self, "src", src)
        object.__setattr__(self, "dst", dst)
        object.__setattr__(self, "t", t)
        if self.label is not None:
            label = np.ascontiguousarray(self.label, dtype=np.float32)
            if label.shape != (e,):
                raise ConfigError(f"TemporalEvents.label must have shape ({e},), got {label.shape}")
            object.__setattr__(self, "label", label)
        if self.edge_feat is not None:
            feat = np.ascontiguousarray(self.edge_feat, dtype=np.float32)
            if feat.ndim != 2 or feat.shape[0] != e:
                raise ConfigError(f"TemporalEvents.edge_feat must have shape ({e}, F), got {feat.shape}")
            object.__setattr__(self, "edge_feat", feat)
        if self.num_nodes < 0:
            raise ConfigError(f"TemporalEvents.num_nodes must be >= 0, got {self.num_nodes}")
        if e:
            lo, hi = int(min(src.min(), dst.min())), int(max(src.max(), dst.max()))
            if lo < 0 or hi >= self.num_nodes:
                bad = lo if lo < 0 else hi
                raise ConfigError(f"TemporalEvents: node id {bad} is outside [0, num_nodes={self.num_nodes})")
            down = np.flatnonzero(t[1:] < t[:-1])
            if down.size:
                i = int(down[0]) + 1
                raise ConfigError(
                    f"TemporalEvents must be in time order: t[{i}] = {t[i]} < t[{i - 1}] = {t[i - 1]}"
                )
            if t.dtype.kind == "f" and not np.isfinite(t).all():
                raise ConfigError("TemporalEvents.t must be finite, found NaN or infinity")

    @property
    def num_events(self) -> int:
        return int(self.src.shape[0])

    @property
    def edge_dim(self) -> int:
        """F, the number of edge-feature columns (0 without features)."""
        return 0 if self.edge_feat is None else int(self.edge_feat.shape[1])

    def __len__(self) -> int:
        return self.num_events

    def head(self, num_events: int) -> TemporalEvents:
        """The first ``num_events`` events (views, same ``num_nodes``): a shorter stream for tests and demos."""
        n = min(max(int(num_events), 0), self.num_events)
        return TemporalEvents(
            src=self.src[:n], dst=self.dst[:n], t=self.t[:n], num_nodes=self.num_nodes,
            label=None if self.label is None else self.label[:n],
            edge_feat=None if self.edge_feat is None else self.edge_feat[:n],
        )

    def __repr__(self) -> str:
        span = f", t {self.t[0]}..{self.t[-1]}" if self.num_events else ""
        return (f"TemporalEvents({self.num_events:,} events, {self.num_nodes:,} nodes{span}, "
                f"edge_dim={self.edge_dim}, labels={self.label is not None})")


# --------------------------------------------------------------------------------------------- JODIE CSV
_OURS = ("u", "i", "ts", "label")
_JODIE = ("user_id", "item_id", "timestamp", "state_label")
_EXPECTED_HEADER = "'u,i,ts,label[,f0,...]' or 'user_id,item_id,timestamp,state_label[,features...]' (JODIE)"


def read_jodie_csv(path: str | os.PathLike) -> TemporalEvents:
    """Read a JODIE-style interaction CSV (both layouts in the module docstring), with or without features.

    Parsed by pyarrow's multi-threaded CSV reader (the 157,474-line Wikipedia file in about 0.1 s); when it
    rejects the file, a line-by-line pass finds the first bad line for the error message. Blank lines are skipped.
    A gzip, xz or bz2 file is read through its codec (recognised by its first bytes).

    Raises:
        InputFormatError: unknown header, a wrong field count, a non-numeric or empty field, a negative id or
            one >= 2 E + 1024 (see `read_snap_temporal`), a NaN time, or a time smaller than the one before (file
            and 1-based line in the message); a truncated or corrupt compressed file.
    """
    with codec_errors(path):
        return _read_jodie_csv(Path(path))


def _read_jodie_csv(path: Path) -> TemporalEvents:
    """`read_jodie_csv` inside its codec guard."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    path = Path(path)
    header, first = _head_lines(path)
    names = [h.strip().lower() for h in header.split(",")] if header is not None else []
    if tuple(names[:4]) not in (_OURS, _JODIE):
        found = "an empty file" if header is None else repr(header[:80])
        raise InputFormatError(path, f"unknown header: expected {_EXPECTED_HEADER}, found {found}", line=1)
    jodie = tuple(names[:4]) == _JODIE
    if jodie:  # JODIE's header names the whole feature list once; the first data line says how many there are
        num_fields = len(first.split(",")) if first is not None else len(names)
        num_fields = max(num_fields, 4)
    else:
        num_fields = len(names)
    columns = [f"c{j}" for j in range(num_fields)]
    types = {c: pa.float32() for c in columns}
    types.update(c0=pa.int64(), c1=pa.int64(), c2=pa.float64())
    try:
        with open_decompressed(path) as f:
            table = pacsv.read_csv(
                f,
                read_options=pacsv.ReadOptions(skip_rows=1, column_names=columns, use_threads=arrow_threads(path)),
                convert_options=pacsv.ConvertOptions(column_types=types, null_values=[""],
                                                     quoted_strings_can_be_null=False),
            )
    except pa.ArrowInvalid as err:
        line, message = _first_bad_line(path, num_fields, jodie)
        if line is None:
            raise InputFormatError(path, f"cannot parse as CSV: {err}") from None
        raise InputFormatError(path, message, line=line) from None

    for j, c in enumerate(columns):
        nulls = table.column(c).null_count
        if nulls:
            row = int(np.flatnonzero(table.column(c).is_null().to_numpy(zero_copy_only=False))[0])
            line = _line_of_row(path, row)
            raise InputFormatError(path, f"empty field {j + 1} ({_field_name(j, jodie)}): expected a number", line=line)
    u = table.column("c0").to_numpy()
    i = table.column("c1").to_numpy()
    ts = table.column("c2").to_numpy()
    label = table.column("c3").to_numpy() if num_fields > 3 else None
    feat = (np.stack([table.column(c).to_numpy() for c in columns[4:]], axis=1) if num_fields > 4 else None)
    _check_rows(path, u, i, ts, jodie)
    bound = max_plausible_nodes(u.shape[0])
    big = np.flatnonzero((u >= bound) | (i >= bound))
    if big.size:  # a stray or raw external id: every per-node array would be that long
        r = int(big[0])
        raise InputFormatError(
            path, f"node id {int(max(u[r], i[r])):,} is out of range: ids must be < 2 x {u.shape[0]:,} events + "
                  f"1,024, since a larger id would make mostly isolated nodes; renumber the ids to 0..n-1",
            line=_line_of_row(path, r))

    if jodie:
        num_users = int(u.max()) + 1 if u.size else 0
        i = i + num_users  # items after users, as TGN's preprocessing does
    num_nodes = int(max(u.max(), i.max())) + 1 if u.size else 0
    whole = ts.size == 0 or (np.abs(ts).max() < 2.0**53 and (np.floor(ts) == ts).all())
    events = TemporalEvents(src=u, dst=i, t=ts.astype(np.int64) if whole else ts, num_nodes=num_nodes,
                            label=label, edge_feat=feat)
    log.info("read %s (%s layout): %s", path, "JODIE" if jodie else "u,i,ts", events)
    return events


def _head_lines(path: Path) -> tuple[str | None, str | None]:
    """The header line and the first non-blank data line (None where missing)."""
    with open_decompressed(path) as f:
        lines = iter(f)
        header = next(lines, None)
        first = next((ln for ln in lines if ln.strip(b"\r\n")), None)
    dec = (lambda b: None if b is None else b.decode("utf-8", "replace").rstrip("\r\n"))
    return dec(header), dec(first)


def _field_name(j: int, jodie: bool) -> str:
    names = _JODIE if jodie else _OURS
    return names[j] if j < 4 else f"feature {j - 4}"


def _first_bad_line(path: Path, num_fields: int, jodie: bool) -> tuple[int | None, str]:
    """Line-by-line check (only after the fast reader failed): the first line that is not a valid row."""
    with open_decompressed(path) as f:
        for lineno, raw in enumerate(f, start=1):
            if lineno == 1:
                continue
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            if not text:
                continue
            fields = text.split(",")
            shown = text if len(text) <= 80 else text[:80] + "..."
            if len(fields) != num_fields:
                return lineno, f"expected {num_fields} comma-separated fields, found {len(fields)}: {shown!r}"
            for j, field in enumerate(fields):
                kind = "an integer node id" if j < 2 else "a number"
                try:
                    int(field) if j < 2 else float(field)
                except ValueError:
                    return lineno, (f"field {j + 1} ({_field_name(j, jodie)}) is {field!r}: expected {kind} "
                                    f"(line {shown!r})")
    return None, ""


def _line_of_row(path: Path, row: int) -> int:
    """1-based file line of data row ``row`` (0-based, after the header, blank lines skipped)."""
    seen = -1
    with open_decompressed(path) as f:
        for lineno, raw in enumerate(f, start=1):
            if lineno > 1 and raw.strip(b"\r\n"):
                seen += 1
                if seen == row:
                    return lineno
    return lineno


def _check_rows(path: Path, u: np.ndarray, i: np.ndarray, ts: np.ndarray, jodie: bool) -> None:
    """Negative ids, non-finite times and decreasing times, the earliest reported at its line (vectorised)."""
    first = {}  # kind -> first offending data row
    for kind, bad in (("id", (u < 0) | (i < 0)), ("time", ~np.isfinite(ts))):
        rows = np.flatnonzero(bad)
        if rows.size:
            first[kind] = int(rows[0])
    down = np.flatnonzero(ts[1:] < ts[:-1])
    if down.size:
        first["order"] = int(down[0]) + 1
    if not first:
        return
    kind, r = min(first.items(), key=lambda kv: kv[1])
    line = _line_of_row(path, r)
    if kind == "id":
        j = 0 if u[r] < 0 else 1
        message = f"negative {_field_name(j, jodie)} {int((u, i)[j][r])}: expected ids >= 0"
    elif kind == "time":
        message = f"timestamp {ts[r]}: expected a finite number"
    else:
        message = (f"timestamps must not decrease: {_num(ts[r])} comes after {_num(ts[r - 1])} on line "
                   f"{_line_of_row(path, r - 1)} (expected events in time order)")
    raise InputFormatError(path, message, line=line)


def _num(x) -> str:
    x = float(x)
    return str(int(x)) if x.is_integer() else repr(x)


# --------------------------------------------------------------------------------------------- SNAP temporal
_HASH, _PERCENT = ord("#"), ord("%")


def read_snap_temporal(path: str | os.PathLike, *, num_nodes: int | None = None, sort: bool = False,
                       block_bytes: int = BLOCK_BYTES) -> TemporalEvents:
    """Read a SNAP temporal edge list (``src dst unix_time`` per line) as a stream; ids are kept as given.

    Args:
        path: plain, gzip, xz or bz2 text; ``#`` and ``%`` comment lines anywhere.
        num_nodes: N when known (ids must be < N); by default ``max id + 1``, and then ids must be < 2 E + 1024
            (E events touch at most 2E nodes: a larger id is a stray or raw external id, and would make every
            per-node array, such as the temporal CSR's, that long).
        sort: a stream whose times decrease somewhere is an error unless True; then it is sorted by time
            (stably: equal times keep file order).
        block_bytes: decompressed bytes scanned at a time (memory about 10x this at the peak).

    Raises:
        InputFormatError: a line without exactly 3 fields, a non-integer or negative value, an id out of range,
            or (unless ``sort``) a time smaller than the line before it; file and 1-based line in the message.
    """
    if num_nodes is not None and num_nodes < 0:
        raise ConfigError(f"num_nodes must be >= 0, got {num_nodes}")
    ids, t = _scan_snap_temporal(path, num_nodes, None, sort, block_bytes)  # (E, 2), (E,)
    bound = max_plausible_nodes(t.shape[0])
    if num_nodes is None and ids.size and int(ids.max()) >= bound:  # scan again to name the line
        hint = (f"without num_nodes, ids must be < 2 x {t.shape[0]:,} events + 1,024, since a larger id would "
                f"make mostly isolated nodes; pass num_nodes=N if there really are that many, or renumber the "
                f"ids to 0..n-1")
        _scan_snap_temporal(path, bound, hint, sort, block_bytes)
        raise InputFormatError(path, f"a node id is >= {bound:,}: {hint}")  # the file changed between the scans
    if sort:
        order = np.argsort(t, kind="stable")
        ids, t = ids[order], t[order]
    n = num_nodes if num_nodes is not None else (int(ids.max()) + 1 if ids.size else 0)
    events = TemporalEvents(src=ids[:, 0], dst=ids[:, 1], t=t, num_nodes=n)
    log.info("read %s: %s", path, events)
    return events


def _scan_snap_temporal(path, upper: int | None, hint: str | None, sort: bool, block_bytes: int
                        ) -> tuple[np.ndarray, np.ndarray]:
    """(ids int64 (E, 2), t int64 (E,)) in file order; the first problem of a block raises."""
    ids_out, t_out = [], []
    prev: tuple[int, int] | None = None  # (time, line) of the last row of the previous block
    for tb in iter_token_blocks(path, block_bytes=block_bytes):
        if tb.num_lines == 0:
            continue
        lead = tb.lead_byte()  # (L,)
        data = (lead != _HASH) & (lead != _PERCENT)
        problems = []
        wrong = data & (tb.line_count != 3)
        if wrong.any():
            j = int(np.argmax(wrong))
            lineno = int(tb.line[tb.line_start[j]])
            problems.append((lineno, f"expected 3 fields (src dst unix_time) separated by tabs or spaces, found "
                                     f"{int(tb.line_count[j])}: {tb.line_text(lineno)!r}"))
            data &= ~wrong
        tokens = np.flatnonzero(np.repeat(data, tb.line_count)).reshape(-1, 3)  # (R, 3) token indices
        ids, p_ids = tb.parse_ints(tokens[:, :2].ravel(), "node id")  # (2R,)
        t, p_t = tb.parse_ints(tokens[:, 2], "timestamp")  # (R,)
        problems += [p_ids, p_t]
        if upper is not None and p_ids is None and ids.size and int(ids.max()) >= upper:
            k = int(np.argmax(ids >= upper))
            lineno = int(tb.line[tokens[:, :2].ravel()[k]])
            why = hint or f"expected node ids in [0, {upper})"
            problems.append((lineno, f"node id {int(ids[k])} is out of range: {why} (line {tb.line_text(lineno)!r})"))
        if not sort and t.size and p_t is None:
            lines = tb.line[tokens[:, 2]]  # (R,) file line of each row
            down = np.flatnonzero(t[1:] < t[:-1]) + 1
            if prev is not None and t[0] < prev[0]:
                down = np.concatenate([[0], down])
            if down.size:
                r = int(down[0])
                before = (int(t[r - 1]), int(lines[r - 1])) if r > 0 else prev
                problems.append((int(lines[r]), f"timestamps must not decrease: {int(t[r])} comes after "
                                                f"{before[0]} on line {before[1]} (expected a time-ordered "
                                                f"stream; pass sort=True to sort it)"))
            prev = (int(t[-1]), int(lines[-1]))
        problem = first_problem(*problems)
        if problem is not None:
            raise tb.error(*problem)
        ids_out.append(ids.reshape(-1, 2))
        t_out.append(t)
    ids = np.concatenate(ids_out) if ids_out else np.zeros((0, 2), dtype=np.int64)  # (E, 2)
    t = np.concatenate(t_out) if t_out else np.zeros(0, dtype=np.int64)  # (E,)
    return ids, t


# --------------------------------------------------------------------------------------------- splits
@dataclass(frozen=True)
class TemporalSplit:
    """Train / validation / test as three consecutive ranges of event ids: ``[0, train_end)``,
    ``[train_end, val_end)``, ``[val_end, num_events)``."""

    train_end: int
    val_end: int
    num_events: int

    @property
    def train(self) -> slice:
        return slice(0, self.train_end)

    @property
    def val(self) -> slice:
        return slice(self.train_end, self.val_end)

    @property
    def test(self) -> slice:
        return slice(self.val_end, self.num_events)

    def ids(self, part: str) -> np.ndarray:
        """int64 event ids of ``part`` ("train", "val" or "test"), ascending."""
        s = self._part(part)
        return np.arange(s.start, s.stop, dtype=np.int64)

    def mask(self, part: str) -> np.ndarray:
        """bool (num_events,): True on the events of ``part``."""
        out = np.zeros(self.num_events, dtype=bool)
        out[self._part(part)] = True
        return out

    def _part(self, part: str) -> slice:
        if part not in ("train", "val", "test"):
            raise ConfigError(f"split part must be 'train', 'val' or 'test', got {part!r}")
        return getattr(self, part)


def chronological_split(events: TemporalEvents, val: float = 0.15, test: float = 0.15) -> TemporalSplit:
    """Cut the stream by time: the first ``1 - val - test`` of the events train, then ``val``, then ``test``.

    A cut that would fall inside a group of events with the same timestamp moves to the end of that group, so
    that a timestamp never straddles two parts (TGN's ``t <= quantile`` rule gives the same kind of cut).

    Raises:
        ConfigError: fractions outside (0, 1) or summing to 1 or more, or a part left empty by the ties.
    """
    for name, f in (("val", val), ("test", test)):
        if not 0.0 < f < 1.0:
            raise ConfigError(f"chronological_split: {name} must be in (0, 1), got {f}")
    if val + test >= 1.0:
        raise ConfigError(f"chronological_split: val + test = {val} + {test} = {val + test} must be < 1")
    t, e = events.t, events.num_events

    def cut(fraction: float) -> int:
        k = int(round(e * fraction))
        return 0 if k <= 0 else int(np.searchsorted(t, t[min(k, e) - 1], side="right"))

    train_end, val_end = cut(1.0 - val - test), cut(1.0 - test)
    if not 0 < train_end < val_end < e:
        raise ConfigError(
            f"chronological_split of {e:,} events gives train/val/test sizes {train_end:,}/"
            f"{val_end - train_end:,}/{e - val_end:,}: expected three non-empty parts (too few events, "
            f"or too many sharing one timestamp)"
        )
    return TemporalSplit(train_end, val_end, e)


@dataclass(frozen=True, eq=False)
class InductiveSplit:
    """TGN's inductive protocol: some nodes are hidden from training so that their val/test events are "new".

    Shapes:
        held_out int64 (H,) the nodes drawn to be hidden, ascending;  train_mask bool (E,) the training events
        kept (those of the train range touching no held-out node);  new_node_val_mask, new_node_test_mask
        bool (E,) val/test events with at least one endpoint that no kept training event touches.
    """

    held_out: np.ndarray
    train_mask: np.ndarray
    new_node_val_mask: np.ndarray
    new_node_test_mask: np.ndarray

    @property
    def train_ids(self) -> np.ndarray:
        """int64 ids of the kept training events, ascending."""
        return np.flatnonzero(self.train_mask)


def inductive_nodes(events: TemporalEvents, split: TemporalSplit, fraction: float = 0.1, seed: int = 0
                    ) -> InductiveSplit:
    """Draw ``int(fraction * nodes in the stream)`` nodes among those with a val or test event; remove every
    training event that touches one of them (as TGN's ``get_data`` does).

    Raises:
        ConfigError: ``fraction`` outside [0, 1], or more nodes asked for than appear in val/test.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ConfigError(f"inductive_nodes: fraction must be in [0, 1], got {fraction}")
    if split.num_events != events.num_events:
        raise ConfigError(f"the split is of {split.num_events:,} events but the stream has {events.num_events:,}")
    n = events.num_nodes
    src, dst = events.src, events.dst

    def flags(*parts: np.ndarray) -> np.ndarray:  # bool (N,): the node appears in one of the arrays
        out = np.zeros(n, dtype=bool)
        for p in parts:
            out[p] = True
        return out

    appears = flags(src, dst)
    late = flags(src[split.train_end:], dst[split.train_end:])  # nodes with a val or test event
    count = int(fraction * int(appears.sum()))
    pool = np.flatnonzero(late)
    if count > pool.size:
        raise ConfigError(f"inductive_nodes: {count:,} nodes asked for (fraction {fraction}) but only "
                          f"{pool.size:,} appear in val/test")
    held_out = np.sort(np.random.default_rng(seed).choice(pool, size=count, replace=False)).astype(np.int64)
    hidden = flags(held_out)
    train_mask = split.mask("train") & ~hidden[src] & ~hidden[dst]
    seen = flags(src[train_mask], dst[train_mask])
    new_node = ~seen[src] | ~seen[dst]
    return InductiveSplit(held_out, train_mask, split.mask("val") & new_node, split.mask("test") & new_node)
