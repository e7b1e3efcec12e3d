"""torchrun script: each rank writes its pid to OUT_DIR/rank<r>.pid and then sleeps far longer than any test."""

import os
import sys
import time
from pathlib import Path

out = Path(sys.argv[1])
(out / f"rank{os.environ['RANK']}.pid").write_text(str(os.getpid()))
time.sleep(600)
