"""Plain-text tables for CLI summaries and benchmark reports.

::

    part  inner  halo  halo/inner
    ----  -----  ----  ----------
       0    100    12        0.12
       1     98    15        0.15

Numbers are right-aligned, text left-aligned; ints get thousands separators, floats ``float_fmt`` (one spec
for all columns, or one per column).
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral, Real

__all__ = ["format_table"]


def _cell(value: object, float_fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, Integral):
        return f"{int(value):,}"
    if isinstance(value, Real):
        return format(float(value), float_fmt)
    return str(value)


def format_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    float_fmt: str | Sequence[str] = ".3f",
    title: str | None = None,
) -> str:
    """Render ``rows`` under ``headers`` as aligned columns (no trailing newline).

    Args:
        headers: column names.
        rows: one sequence per row, each with ``len(headers)`` cells (ints, floats, strings or None).
        float_fmt: format spec for floats (``".3f"``, ``".2%"``, ...), or a sequence of one spec per column.
        title: optional line printed above the table.

    Raises:
        ValueError: a row has a different number of cells than ``headers``.
    """
    fmts = [float_fmt] * len(headers) if isinstance(float_fmt, str) else list(float_fmt)
    if len(fmts) != len(headers):
        raise ValueError(f"float_fmt has {len(fmts)} specs, expected one per header ({len(headers)}) or one string")
    for i, row in enumerate(rows):
        if len(row) != len(headers):
            raise ValueError(f"table row {i} has {len(row)} cells, expected {len(headers)} (one per header)")
    text = [[_cell(v, f) for v, f in zip(row, fmts)] for row in rows]
    numeric = [
        all(isinstance(row[j], Real) and not isinstance(row[j], bool) or row[j] is None for row in rows)
        for j in range(len(headers))
    ]
    widths = [max([len(h)] + [len(r[j]) for r in text]) for j, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric)]
        return "  ".join(parts).rstrip()

    out = [title] if title else []
    out += [line(list(headers)), line(["-" * w for w in widths])]
    out += [line(r) for r in text]
    return "\n".join(out)
