"""Small generic helpers shared across haloflow: atomic writes, progress bars, tables, peak memory."""

from haloflow.utils.arrays import sorted_unique
from haloflow.utils.atomic import atomic_directory, atomic_write_text, check_absent
from haloflow.utils.memory import format_bytes, peak_rss_bytes, reset_peak_rss
from haloflow.utils.progress import progress_bar
from haloflow.utils.table import format_table

__all__ = [
    "atomic_directory",
    "atomic_write_text",
    "check_absent",
    "format_bytes",
    "peak_rss_bytes",
    "reset_peak_rss",
    "progress_bar",
    "format_table",
    "sorted_unique",
]
