"""Is a file already at an output path one that haloflow wrote? Told by its header or metadata, never by its name.

A file output (``--save``, ``--log-jsonl``, the ``--out`` of plan-tables, bench, predict, plot) replaces a regular
file only when one of these recognises it, or with ``--overwrite`` (``atomic.check_file_replaceable``)::

    output                  recognised by
    --log-jsonl             its first line starts as every record of ours does: {"kind": "
    --save (GCN)            a torch zip whose pickle names model_config, state_dict and train_config
    plan-tables --out       a JSON object whose "format" is haloflow.sharding_plan
    bench --out             a JSON object whose "written_by" starts with "haloflow" (or one in bench-results/)
    predict --out, --embeddings   Parquet: "written_by" in the schema's metadata; CSV: the header predict writes
    plot --out              a PNG whose "Software" text chunk is "haloflow plot"

Each reads at most a few MiB of the file: a large data file is told apart by its first bytes.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

__all__ = ["WRITTEN_BY", "stamped", "jsonl_log", "torch_model", "sharding_plan", "bench_results", "predict_table",
           "plot_png", "PLOT_SOFTWARE"]

WRITTEN_BY = "written_by"  # the key bench results carry: "haloflow bench NAME"
_JSON_LIMIT = 64 << 20  # a results or plan file is far smaller; a larger file is someone's data


def stamped(result: dict, what: str) -> dict:
    """``result`` with ``"written_by": "haloflow WHAT"`` first, so that a later run knows the file as its own."""
    return {WRITTEN_BY: f"haloflow {what}", **result}


def jsonl_log(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(64)
    return head.startswith(b'{"kind": "')


def torch_model(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as z:
            pickles = [n for n in z.namelist() if n.endswith("/data.pkl")]
            if len(pickles) != 1 or z.getinfo(pickles[0]).file_size > _JSON_LIMIT:
                return False
            blob = z.read(pickles[0])
    except (OSError, zipfile.BadZipFile, KeyError):
        return False
    return all(key in blob for key in (b"model_config", b"state_dict", b"train_config"))


def _json_object(path: Path) -> dict | None:
    if path.stat().st_size > _JSON_LIMIT:
        return None
    try:
        obj = json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def sharding_plan(path: Path) -> bool:
    from haloflow.partition.planner.types import PLAN_FORMAT

    obj = _json_object(path)
    return obj is not None and obj.get("format") == PLAN_FORMAT


def bench_results(path: Path) -> bool:
    """Stamped by ``haloflow bench``, or a JSON object in a ``bench-results`` folder (written before the stamp)."""
    obj = _json_object(path)
    return obj is not None and (str(obj.get(WRITTEN_BY, "")).startswith("haloflow")
                                or path.resolve().parent.name == "bench-results")


PLOT_SOFTWARE = "haloflow plot"  # the PNG's "Software" text chunk
# the first columns of every table `haloflow predict` writes (pyarrow quotes CSV header names)
_PREDICT_CSV_HEADS = (b'"node_id","', b'"row","', b'"event","src","dst","')


def predict_table(path: Path) -> bool:
    """A Parquet file that predict stamped in its schema's metadata, or a CSV that starts with predict's header."""
    with open(path, "rb") as f:
        head = f.read(4096)
    if not head.startswith(b"PAR1"):
        return head.startswith(_PREDICT_CSV_HEADS)
    import pyarrow.parquet as pq

    try:
        meta = pq.read_schema(path).metadata or {}
    except (OSError, ValueError):
        return False
    return meta.get(WRITTEN_BY.encode(), b"").startswith(b"haloflow")


def plot_png(path: Path) -> bool:
    """A PNG whose first 4 KiB hold the text chunk ``Software: haloflow plot`` (matplotlib writes it early)."""
    with open(path, "rb") as f:
        head = f.read(4096)
    return head.startswith(b"\x89PNG") and b"Software\x00" + PLOT_SOFTWARE.encode() in head
