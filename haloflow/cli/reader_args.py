"""Flags that pick how a data set is read, shared by `haloflow partition` and `haloflow train gcn --dataset`.

Each format takes only its own options (``num_nodes``, ``one_based``, ``skip_lines`` for SNAP; ``name`` for
Planetoid; ``split``
for OGB), so only the flags a user gave are passed on; the readers' messages are rewritten to name the flags.
"""

from __future__ import annotations

import argparse

__all__ = ["add_reader_arguments", "reader_options", "READER_FLAGS"]

# Reader options as read_dataset names them -> the flags (e.g. "format 'pace' takes no option --num-nodes").
READER_FLAGS = {
    "option 'num_nodes'": "option --num-nodes", "option 'one_based'": "option --one-based",
    "option 'name'": "option --name", "option 'split'": "option --split", "num_nodes must": "--num-nodes must",
    "option 'skip_lines'": "option --skip-lines", "skip_lines must": "--skip-lines must",
    "expected num_nodes or one_based or skip_lines": "expected --num-nodes or --one-based or --skip-lines",
    "expected name": "expected --name",
    "expected split or symmetrize": "expected --split",
}


def add_reader_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("reading the input")
    g.add_argument(
        "--num-nodes", type=int, default=None, metavar="N",
        help="SNAP edge list: the number of nodes, isolated ones included (ids must be < N); without it ids must "
        "be < 2 x edges + 1024, so that a stray id cannot size a huge graph",
    )
    g.add_argument("--one-based", action="store_true",
                   help="SNAP edge list: ids start at 1 (KONECT, some SNAP copies); id k becomes node k - 1")
    g.add_argument("--skip-lines", type=int, default=None, metavar="N",
                   help="SNAP edge list: skip the file's first N lines, whatever they hold: a header of another "
                   "shape, e.g. 1 for a JuliaGraphs .jlg file's 'n,m,directed,...' line (add --one-based: its ids "
                   "start at 1)")
    g.add_argument("--name", default=None, help="Planetoid folder holding several sets: the one to read (e.g. cora)")
    g.add_argument("--split", default=None, metavar="SCHEME",
                   help="OGB folder with several split schemes under split/: the one to use")


def reader_options(args: argparse.Namespace) -> dict:
    """The reader options the user gave (and only those)."""
    options = {"num_nodes": args.num_nodes, "one_based": args.one_based or None, "skip_lines": args.skip_lines,
               "name": args.name, "split": args.split}
    return {k: v for k, v in options.items() if v is not None}
