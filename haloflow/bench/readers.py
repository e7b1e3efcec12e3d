"""Graph reader benchmark: haloflow's vectorised readers against numpy's and pyarrow's text parsers in the same run.

For each real graph in $HALOFLOW_DATA/graphs it times (best of ``--repeat``):

- ``ours``: :func:`read_snap` / :func:`read_pace` end to end (decompress, tokenise, validate, build the CSR);
- ``ours_parse``: the same file scanned into an edge array only (no CSR), the part the peers also do;
- ``loadtxt``: ``np.loadtxt`` (numpy's C parser) on the same file, into an edge array;
- ``pyarrow``: decompress, ``pyarrow.csv.read_csv`` skipping the leading header / comment lines, into arrays
  (it cannot skip comments elsewhere, so it is a lower bound, not a general reader).

The ratios (peer seconds / ours_parse seconds) are what to compare across machines; seconds alone are not.

    haloflow bench readers                    # all three graphs, best of 3 (about a minute on 2 cores)
    haloflow bench readers --graphs slashdot --repeat 1
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.csv as pacsv

from haloflow.bench.args import at_least, names
from haloflow.data import data_root
from haloflow.data.readers import read_pace, read_snap
from haloflow.data.textscan import open_decompressed, read_int_rows
from haloflow.utils.atomic import atomic_write_text
from haloflow.utils.table import format_table
from haloflow.utils.help_format import HelpFormatter

GRAPHS = {  # name: (file, reader, header lines the peers skip, comment character)
    "road": ("graphs/USA-road-NE.pace.gr.xz", read_pace, 1, "c"),
    "slashdot": ("graphs/soc-Slashdot0902.txt.gz", read_snap, 0, "#"),
    "enron": ("graphs/email-Enron.txt.gz", read_snap, 0, "#"),
}


def best_of(fn, repeat: int) -> tuple[object, float]:
    best, out = float("inf"), None
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return out, best


def loadtxt(path: Path, skip: int, comment: str) -> np.ndarray:
    with open_decompressed(path) as f:
        return np.loadtxt(f, dtype=np.int64, comments=comment, skiprows=skip, usecols=(0, 1))


def pyarrow_read(path: Path, skip: int, comment: str) -> np.ndarray:
    """Decompress, skip the header and the leading comment lines (where these files keep them), parse."""
    with open_decompressed(path) as f:
        data = f.read()
    lines = data[:1 << 16].split(b"\n")
    while lines[skip].startswith(comment.encode()):
        skip += 1
    delimiter = "\t" if b"\t" in lines[skip] else " "
    table = pacsv.read_csv(
        io.BytesIO(data),
        read_options=pacsv.ReadOptions(column_names=["src", "dst"], skip_rows=skip),
        parse_options=pacsv.ParseOptions(delimiter=delimiter),
    )
    return np.stack([table["src"].to_numpy(), table["dst"].to_numpy()], axis=1)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    parser.add_argument("--graphs", type=names(tuple(GRAPHS)), default=",".join(GRAPHS),
                        help="comma-separated subset of " + ",".join(GRAPHS))
    parser.add_argument("--repeat", type=at_least(1), default=3, help="best of this many runs per reader")
    parser.add_argument("--out", default="bench-results/readers.json", help="JSON results path")
    args = parser.parse_args(argv)
    root = data_root()
    if not (root / "graphs").is_dir():
        print(f"no real graphs under {root} (set HALOFLOW_DATA)", file=sys.stderr)
        return 2
    rows, records = [], []
    for name in args.graphs.split(","):
        rel, reader, skip, comment = GRAPHS[name]
        path = root / rel
        graph, t_ours = best_of(lambda: reader(path), args.repeat)
        # The edge scan alone; the road file's only non-edge line is its 'p' header, so skip lines starting 'p'.
        parse = lambda: read_int_rows(path, 2, comment="p" if reader is read_pace else "#")  # noqa: E731
        edges, t_parse = best_of(parse, args.repeat)
        ref, t_loadtxt = best_of(lambda: loadtxt(path, skip, comment), args.repeat)
        arrow, t_arrow = best_of(lambda: pyarrow_read(path, skip, comment), args.repeat)
        assert np.array_equal(edges, ref) and np.array_equal(edges, arrow), f"{name}: readers disagree"
        record = {
            "graph": name, "nodes": graph.num_nodes, "file_edges": int(edges.shape[0]),
            "ours_s": t_ours, "ours_parse_s": t_parse, "loadtxt_s": t_loadtxt, "pyarrow_s": t_arrow,
            "loadtxt_over_ours": t_loadtxt / t_parse, "pyarrow_over_ours": t_arrow / t_parse,
        }
        records.append(record)
        rows.append([name, graph.num_nodes, int(edges.shape[0]), t_ours, t_parse, t_loadtxt, t_arrow,
                     record["loadtxt_over_ours"], record["pyarrow_over_ours"]])
    print(format_table(
        ["graph", "nodes", "file edges", "ours s", "ours parse s", "loadtxt s", "pyarrow s", "loadtxt/ours",
         "pyarrow/ours"], rows, float_fmt=".2f", title=f"graph readers, best of {args.repeat}"))
    out = atomic_write_text(args.out, json.dumps({"benchmark": "readers", "repeat": args.repeat, "results": records},
                                                 indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":  # a worker or a direct run: the settings the CLI applies (haloflow/host)
    from haloflow import host

    host.apply()
    sys.exit(main())
