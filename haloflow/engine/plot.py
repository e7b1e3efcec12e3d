"""`plot_logs`: the loss and metric curves of one or several runs, from their ``--log-jsonl`` files, as one PNG.

::

    LOG.jsonl lines (engine/trainer.py)           the figure
      {"kind": "epoch", "epoch": 3, "loss": ...,     left:  loss per unit (GCN epoch, DLRM logged step, TGN epoch)
       "val_acc": ..., "attempt": 0, ...}            right: every *_acc / *_auc / *_ap the unit records carry
      {"kind": "train", "step": 100, "loss": ...}    one line per run and metric, named by the log file
      {"kind": "summary", ...}                       (not drawn: one point)

A run that torchrun restarted has each unit once in its log (``MetricsLog.after_restart``), so its curve is one
line. matplotlib draws off screen (Agg): no display is needed.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from haloflow.errors import ConfigError, InputFormatError
from haloflow.utils.atomic import atomic_output, check_file_replaceable
from haloflow.utils.config_flags import hidden, option
from haloflow.utils.owned import PLOT_SOFTWARE, plot_png

__all__ = ["PlotConfig", "plot_logs", "read_log"]

_X = {"epoch": "epoch", "train": "step"}  # a unit record's kind -> its x field
_METRIC_ENDS = ("_acc", "_auc", "_ap")

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class PlotConfig:
    """``haloflow plot LOG.jsonl [LOG.jsonl ...] --out PNG``.

    Args:
        logs: one or several ``--log-jsonl`` files (one run each).
        out: the PNG to write; None: the first log's name with ``.png``.
        width / height: the figure's size in inches (at 100 dots per inch).
    """

    logs: tuple[Path, ...] = hidden((), why="the command's positional LOG arguments")
    out: Path | None = option(None, metavar="PNG", means="the first log's name with .png",
                              help="the image to write")
    width: float = option(10.0, help="figure width in inches (100 pixels each)")
    height: float = option(4.0, help="figure height in inches (100 pixels each)")
    overwrite: bool = option(False, help="replace a file at --out that plot did not write (one it wrote is "
                             "replaced anyway)")

    def __post_init__(self) -> None:
        logs = tuple(Path(p) for p in self.logs)
        object.__setattr__(self, "logs", logs)
        if not logs:
            raise ConfigError("give at least one --log-jsonl file to plot", field="logs")
        for p in logs:
            if not p.is_file():
                raise FileNotFoundError(f"log {p} does not exist (expected a file written by --log-jsonl)")
        out = Path(self.out) if self.out is not None else logs[0].with_suffix(".png")
        if out.suffix.lower() != ".png":
            raise ConfigError(f"--out {out}: expected a .png file name", field="out")
        check_file_replaceable(out, self.overwrite, plot_png, "--out")
        object.__setattr__(self, "out", out)
        if not (self.width > 0 and self.height > 0):
            raise ConfigError(f"width and height must be > 0, got {self.width} x {self.height}", field="width")


def read_log(path: Path) -> list[dict]:
    """The unit records of a ``--log-jsonl`` file (kinds ``epoch`` and ``train``), in order.

    Raises:
        InputFormatError: a line that is not a JSON object, or no unit record at all.
    """
    out = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise InputFormatError(path, f"not a JSON line ({line[:60]!r}); expected a --log-jsonl file",
                                   line=number) from None
        if not isinstance(record, dict):
            raise InputFormatError(path, f"a JSON {type(record).__name__}, expected an object", line=number)
        if record.get("kind") in _X and "loss" in record:
            out.append(record)
    if not out:
        raise InputFormatError(path, "no epoch or train record with a loss; expected a --log-jsonl file of "
                               "`haloflow train`")
    return out


def plot_logs(config: PlotConfig) -> Path:
    """Draw every log's loss (left) and metrics (right) against its unit; returns the PNG written (atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(p, read_log(p)) for p in config.logs]
    fig, (ax_loss, ax_metric) = plt.subplots(1, 2, figsize=(config.width, config.height), dpi=100)
    metric_drawn = False
    for path, records in runs:
        x_name = _X[records[0]["kind"]]
        xs = [r.get(x_name) for r in records]
        ax_loss.plot(xs, [r["loss"] for r in records], label=path.stem)
        names = sorted({k for r in records for k in r if k.endswith(_METRIC_ENDS)})
        for name in names:
            pts = [(r[x_name], r[name]) for r in records if r.get(name) is not None]
            ax_metric.plot([p[0] for p in pts], [p[1] for p in pts], label=f"{path.stem}: {name}")
            metric_drawn = True
        ax_loss.set_xlabel(x_name)
        ax_metric.set_xlabel(x_name)
    ax_loss.set_title("loss")
    ax_loss.legend(fontsize="small")
    ax_metric.set_title("metrics" if metric_drawn else "metrics (none in these logs)")
    if metric_drawn:
        ax_metric.legend(fontsize="small")
    fig.tight_layout()
    with atomic_output(config.out, "wb") as f:
        fig.savefig(f, format="png", metadata={"Software": PLOT_SOFTWARE})  # ours, to replace (utils/owned.py)
    plt.close(fig)
    log.info("wrote %s", config.out)
    return config.out
