"""Small generic helpers shared across haloflow: atomic folder writes, progress bars, tables, peak memory."""

from haloflow.utils.atomic import atomic_directory
from haloflow.utils.memory import peak_rss_bytes, format_bytes
from haloflow.utils.progress import progress_bar
from haloflow.utils.table import format_table

__all__ = ["atomic_directory", "peak_rss_bytes", "format_bytes", "progress_bar", "format_table"]
