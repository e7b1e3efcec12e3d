"""What a training run wrote, and where: the lines ``haloflow train MODEL`` prints after its summary table.

::

    wrote
      JSON log      runs/m.jsonl                       --log-jsonl
      checkpoints   runs/ck/step-00000040 (newest)     --checkpoint-dir; its newest step folder
      model         runs/model.pt                      --save (GCN)

Read from the config after training, on rank 0 only; nothing is printed for a run that wrote none of them.
"""

from __future__ import annotations

from pathlib import Path

from haloflow.engine.checkpoint import newest

__all__ = ["outputs_written"]


def outputs_written(config) -> str:
    """The outputs of the run that ``config`` (a trainer's config, with ``runtime``) describes, one per line,
    or "" when it wrote none. Paths as the user gave them, so that they can be pasted back."""
    rows = []
    runtime = config.runtime
    if runtime.log_jsonl is not None:
        rows.append(("JSON log", str(runtime.log_jsonl)))
    if runtime.checkpoint.dir is not None:
        step = newest(Path(runtime.checkpoint.dir))
        rows.append(("checkpoints", f"{step} (newest)" if step else f"{runtime.checkpoint.dir} (none written)"))
    save = getattr(config, "save", None)  # GCN's --save: the other trainers' configs have no such field
    if save is not None:
        rows.append(("model", str(save)))
    if not rows:
        return ""
    width = max(len(name) for name, _ in rows)
    return "\n".join(["wrote", *(f"  {name:<{width}}  {path}" for name, path in rows)])
