"""One factory for tqdm progress bars, so every bar in haloflow behaves the same way.

A bar is drawn only when a person can see it: stderr is a terminal and the caller did not turn it off. In CI
logs, pipes and tests it is silent, yet still counts, so code never needs two paths.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

from tqdm.auto import tqdm

__all__ = ["progress_bar"]


def progress_bar(
    iterable: Iterable | None = None,
    *,
    total: int | None = None,
    desc: str | None = None,
    unit: str = "it",
    unit_scale: bool = False,
    enabled: bool = True,
    leave: bool = False,
    initial: int = 0,
) -> tqdm:
    """A tqdm bar on stderr, disabled when ``enabled`` is False or stderr is not a tty.

    Args:
        iterable: wrap this iterable (as ``tqdm(iterable)``), or None to drive the bar by ``update``.
        total: number of steps, when ``iterable`` has no length.
        desc: label shown before the bar; change it with ``bar.set_description_str``.
        unit: name of one step.
        unit_scale: show counts with k/M/G prefixes (for bytes).
        enabled: the caller's switch (e.g. ``progress=False``); a non-tty stderr turns the bar off regardless.
        leave: keep the finished bar on screen.
        initial: steps already done (a run resumed from a checkpoint).
    """
    isatty = getattr(sys.stderr, "isatty", None)
    visible = enabled and bool(isatty and isatty())
    return tqdm(
        iterable, total=total, desc=desc, unit=unit, unit_scale=unit_scale, disable=not visible, leave=leave, file=sys.stderr,
        dynamic_ncols=True, initial=initial,
    )
