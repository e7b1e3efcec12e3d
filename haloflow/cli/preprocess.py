"""``haloflow preprocess criteo RAW... --out DIR`` and ``haloflow preprocess clicks --out DIR`` (synthetic).

Both write the Parquet layout that ``haloflow train dlrm --data DIR`` reads (see ``haloflow.data.criteo_loader``).
"""

from __future__ import annotations

import argparse

from haloflow.utils.table import format_table
from haloflow.utils.help_format import HelpFormatter

__all__ = ["register"]

COMMAND = "preprocess"
HELP = "turn raw click logs into Parquet for DLRM training"


def register(subparsers) -> None:
    parser = subparsers.add_parser(COMMAND, help=HELP, formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="dataset", metavar="DATASET", required=True)

    criteo = sub.add_parser(
        "criteo",
        help="Criteo Kaggle train.txt or Criteo 1TB day_N files",
        description="Dense I1..I13 -> log(1 + max(x, 0)), missing -> 0. Categorical C1..C26 hex -> contiguous "
        "ids: by default every seen value gets an id (1 = most frequent) and missing -> 0; "
        "--frequency-threshold N maps values seen < N times to 0 too; --max-ind-range R uses int(hex) % R "
        "in one pass instead. Kaggle: 7 equal parts by line, 6 train, the 7th halved into test then val; "
        "day_N files: the last day halved into test then val.", formatter_class=HelpFormatter,
    )
    criteo.add_argument("raw", nargs="+", metavar="RAW",
                        help="input files, in order: tab-separated, or CSV with a header line; plain, .gz, .bz2 or .xz")
    criteo.add_argument("--out", required=True, help="output folder (written atomically)")
    criteo.add_argument("--frequency-threshold", type=int, default=None, metavar="N",
                        help="two passes: ids only for values seen >= N times (default 1)")  # fmt: skip
    criteo.add_argument("--max-ind-range", type=int, default=None, metavar="R",
                        help="one pass: id = int(hex) %% R; exclusive with --frequency-threshold")  # fmt: skip
    criteo.add_argument("--layout", default="auto", help="kaggle, days or auto (days if inputs are day_N)")
    criteo.add_argument("--row-group-size", type=int, default=65536, help="rows per Parquet row group")
    criteo.add_argument("--strict", action="store_true", help="stop at the first bad row with file:line")
    criteo.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    criteo.set_defaults(func=_run_criteo)

    clicks = sub.add_parser("clicks", help="a synthetic Criteo-like log (Zipf ids, learnable labels)", formatter_class=HelpFormatter)
    clicks.add_argument("--out", required=True, help="output folder (written atomically)")
    clicks.add_argument("--train", type=int, default=100_000, help="train rows")
    clicks.add_argument("--val", type=int, default=10_000, help="validation rows")
    clicks.add_argument("--test", type=int, default=10_000, help="test rows")
    clicks.add_argument("--scale", type=float, default=1e-3, help="multiply the Kaggle table sizes by this")
    clicks.add_argument("--max-rows", type=int, default=None, help="cap on rows per table")
    clicks.add_argument("--multi-hot", type=float, default=1.0, help="mean ids per bag (1 = one-hot)")
    clicks.add_argument("--seed", type=int, default=0, help="seed of the generated log")
    clicks.add_argument("--row-group-size", type=int, default=65536, help="rows per Parquet row group")
    clicks.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    clicks.set_defaults(func=_run_clicks)


def _run_criteo(args: argparse.Namespace) -> int:
    from haloflow.data.criteo import CriteoPreprocessConfig, preprocess_criteo

    config = CriteoPreprocessConfig(
        raw=tuple(args.raw), out=args.out, min_count=args.frequency_threshold, max_ind_range=args.max_ind_range,
        layout=args.layout, row_group_size=args.row_group_size, strict=args.strict, overwrite=args.overwrite,
    )  # fmt: skip
    print(preprocess_criteo(config).table())
    return 0


def _run_clicks(args: argparse.Namespace) -> int:
    from haloflow.data.clicks import ClickLogConfig, ClickLogGenerator
    from haloflow.data.criteo_loader import SPLITS

    config = ClickLogConfig(scale=args.scale, max_rows=args.max_rows, multi_hot=args.multi_hot, seed=args.seed)
    rows = {"train": args.train, "val": args.val, "test": args.test}
    meta = ClickLogGenerator(config).write_parquet(
        args.out, rows, row_group_size=args.row_group_size, overwrite=args.overwrite
    )
    print(format_table(["split", "rows"], [[split, meta["splits"][split]["rows"]] for split in SPLITS]))
    print(f"{len(meta['table_sizes'])} tables, {sum(meta['table_sizes']):,} rows in all -> {args.out}")
    return 0
