import subprocess
import sys

import pytest

from haloflow.utils.memory import format_bytes

_SCRIPT = """
import numpy as np
from haloflow.utils.memory import peak_rss_bytes, reset_peak_rss
before = peak_rss_bytes()
block = np.ones(256 << 20, dtype=np.uint8)  # 256 MiB, touched
after = peak_rss_bytes()
del block
reset = reset_peak_rss()
print(before, after, int(reset), peak_rss_bytes())
"""


def test_peak_rss_sees_a_large_allocation_and_resets():
    # A fresh process, so that this test does not depend on what ran before it.
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, check=True).stdout
    before, after, reset, again = map(int, out.split())
    assert after - before >= 250 << 20
    if not reset:
        pytest.skip("this system cannot reset the peak RSS")
    assert again < after - (200 << 20)


def test_format_bytes():
    assert [format_bytes(x) for x in (512, 1536, 3 << 20, 5 << 30)] == ["512 B", "1.5 KiB", "3.0 MiB", "5.0 GiB"]
