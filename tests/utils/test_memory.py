import subprocess
import sys

from haloflow.utils.memory import format_bytes

_SCRIPT = """
import numpy as np
from haloflow.utils.memory import peak_rss_bytes
before = peak_rss_bytes()
block = np.ones(256 << 20, dtype=np.uint8)  # 256 MiB, touched
print(before, peak_rss_bytes())
"""


def test_peak_rss_sees_a_large_allocation():
    # A fresh process, so earlier tests cannot have raised the high-water mark already.
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, check=True).stdout
    before, after = map(int, out.split())
    assert after - before >= 250 << 20


def test_format_bytes():
    assert [format_bytes(x) for x in (512, 1536, 3 << 20, 5 << 30)] == ["512 B", "1.5 KiB", "3.0 MiB", "5.0 GiB"]
