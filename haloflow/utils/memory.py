"""Peak memory of this process, for reports (``resource.getrusage``; no extra dependency)."""

from __future__ import annotations

import resource
import sys

__all__ = ["peak_rss_bytes", "format_bytes"]


def peak_rss_bytes() -> int:
    """Largest resident set size this process has had so far, in bytes (a high-water mark; it never drops)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def format_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``; binary units up to TiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
