"""Peak memory of this process, for reports and benchmarks (no dependency beyond the standard library).

On Linux the high-water mark is ``VmHWM`` of ``/proc/self/status``: it belongs to this process image (it starts
afresh at exec, unlike ``getrusage``'s ``ru_maxrss``, which a child inherits from its parent) and
`reset_peak_rss` can set it back to the current RSS to measure one phase. Elsewhere ``ru_maxrss`` is used.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

__all__ = ["peak_rss_bytes", "current_rss_bytes", "reset_peak_rss", "available_bytes", "format_bytes", "parse_bytes"]

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_MEMINFO = Path("/proc/meminfo")


def peak_rss_bytes() -> int:
    """Largest resident set size of this process so far (since start or the last `reset_peak_rss`), in bytes."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # macOS: bytes, Linux: KiB


def current_rss_bytes() -> int:
    """Resident set size of this process now (``VmRSS``), in bytes; the peak where /proc is missing."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return peak_rss_bytes()


def reset_peak_rss() -> bool:
    """Set the high-water mark back to the current RSS (Linux >= 4.0); False where that is not possible.

    Memory freed before the reset goes back to the system first (``haloflow.host.malloc.trim``: glibc keeps big freed
    blocks for reuse), so that a phase measured from here does not start above what it holds."""
    from haloflow.host.malloc import trim

    trim()
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


def available_bytes(device=None) -> int | None:
    """Memory a new allocation can still get: free memory of a CUDA ``device`` (a ``torch.device``), else the
    host's ``MemAvailable``; None where it cannot be told (no /proc)."""
    if device is not None and getattr(device, "type", "cpu") == "cuda":
        import torch

        return int(torch.cuda.mem_get_info(device)[0])
    try:
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    return None


def format_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``; binary units up to TiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 10**3, "m": 1 << 20, "mib": 1 << 20, "mb": 10**6,
          "g": 1 << 30, "gib": 1 << 30, "gb": 10**9, "t": 1 << 40, "tib": 1 << 40, "tb": 10**12}


_MAX_BYTES = 2**63 - 1


def parse_bytes(text: str | int) -> int:
    """``"2GiB"`` -> 2147483648. Binary units (``K``, ``KiB``, ``M``, ``MiB``, ``G``, ``GiB``, ``T``, ``TiB``),
    decimal ones (``KB``, ``MB``, ``GB``, ``TB``), or plain bytes; case and a space before the unit do not matter.

    Raises:
        ValueError: not a non-negative number with one of those units.
    """
    if isinstance(text, (int,)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        s = str(text).strip().lower().replace(" ", "").replace("_", "")
        i = len(s)
        while i and s[i - 1].isalpha():
            i -= 1
        number, unit = s[:i], s[i:]
        try:
            value = float(number)
        except ValueError:
            value = float("nan")
    if unit not in _UNITS or not value >= 0 or value == float("inf"):
        raise ValueError(f"expected a size such as 2GiB, 512MiB or 3000000000 (bytes), got {text!r}")
    if value * _UNITS[unit] > _MAX_BYTES:  # past a 64-bit size: no machine has it, and numpy cannot hold it
        raise ValueError(f"{text!r} is more bytes than a 64-bit size holds (at most 8EiB)")
    return int(value * _UNITS[unit])
