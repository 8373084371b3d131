"""``inferlearn reproduce lifted --table N``: the tables of the lifted-network paper."""
from __future__ import annotations

import shlex

from .common import add_threads_option, set_threads
from ..experiments.lifted_tables import ACTS, ROWS, TABLES, reproduce_table


def register(sub) -> None:
    p = sub.add_parser("reproduce", help="reproduce a paper's tables (lifted: Zach & Estellers 2019, Tables 1-4)")
    p.add_argument("paper", choices=["lifted"], help="which paper")
    p.add_argument("--table", type=int, default=None, choices=sorted(TABLES), help="table number")
    p.add_argument("--alignment", action="store_true",
                   help="instead of a table: sweep γ and compare contrastive gradients with back-propagation's "
                        "(writes OUT/alignment.md)")
    p.add_argument("--duality", action="store_true",
                   help="instead of a table: strong duality and free-energy scoring per unit type (writes OUT/duality.md)")
    p.add_argument("--epochs", type=int, default=None, help="training epochs (default: the paper's, 100 or 50)")
    p.add_argument("--acts", default=",".join(ACTS), help="comma-separated unit types (default %(default)s)")
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated rules (default: all four rows)")
    p.add_argument("--gamma", type=float, default=1 / 8, help="feedback weight (default 1/8)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 1/20)")
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--solver", default=None, help="inference solver of the lifted rules: block-pg (default), cd, reference")
    p.add_argument("--limit-train", type=int, default=None, help="use only the first N training samples")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--allow-unverified", action="store_true",
                   help="read data files whose checksums differ from the published ones (with a warning), "
                        "e.g. the grayscale CIFAR-10 copy for Table 4")
    p.add_argument("--out", default="runs/reproduce_lifted", help="output folder (default %(default)s)")
    p.add_argument("--progress", action="store_true", help="show progress bars")
    add_threads_option(p)
    p.set_defaults(func=run)


def run(args) -> int:
    set_threads(args.threads)
    if args.alignment:
        from pathlib import Path

        from ..atomic import write_text
        from ..experiments.lifted_tables import alignment_report

        cmd = " ".join(["inferlearn", "reproduce", "lifted", "--alignment", "--limit-train", str(args.limit_train or 10000),
                        "--out", shlex.quote(args.out)])
        md = alignment_report(limit_train=args.limit_train or 10000, data_dir=args.data_dir, seed=args.seed, command=cmd)
        write_text(md, Path(args.out) / "alignment.md")
        print(md)
        return 0
    if args.duality:
        from pathlib import Path

        from ..atomic import write_text
        from ..experiments.lifted_tables import duality_report

        cmd = " ".join(["inferlearn", "reproduce", "lifted", "--duality", "--limit-train", str(args.limit_train or 10000),
                        "--out", shlex.quote(args.out)])
        md = duality_report(limit_train=args.limit_train or 10000, data_dir=args.data_dir, seed=args.seed,
                            gamma=args.gamma, command=cmd)
        write_text(md, Path(args.out) / "duality.md")
        print(md)
        return 0
    if args.table is None:
        raise ValueError("Give --table N (1-4), --alignment or --duality")
    if args.epochs is not None and args.epochs < 1:
        raise ValueError(f"Invalid epochs: {args.epochs}")
    if not args.gamma > 0:
        raise ValueError(f"Invalid gamma: {args.gamma}")
    md = reproduce_table(args.table, args.out, epochs=args.epochs,
                         acts=[a.strip() for a in args.acts.split(",") if a.strip()],
                         rows=[r.strip() for r in args.rows.split(",") if r.strip()], gamma=args.gamma, lr=args.lr,
                         batch_size=args.batch_size, seed=args.seed, data_dir=args.data_dir,
                         limit_train=args.limit_train, solver=args.solver,
                         allow_unverified=args.allow_unverified, command=_command(args),
                         progress=args.progress)
    print(md)
    return 0


def _command(args) -> str:
    """The command line that reproduces this run, with every setting explicit."""
    parts = ["inferlearn", "reproduce", "lifted", "--table", str(args.table)]
    if args.epochs is not None:
        parts += ["--epochs", str(args.epochs)]
    for flag, value in (("--acts", args.acts), ("--rows", args.rows), ("--gamma", f"{args.gamma:g}"),
                        ("--lr", f"{args.lr:g}"), ("--batch-size", str(args.batch_size)), ("--seed", str(args.seed)),
                        ("--solver", args.solver), ("--limit-train", args.limit_train), ("--out", args.out)):
        if value is not None:
            parts += [flag, str(value)]
    if args.allow_unverified:
        parts.append("--allow-unverified")
    return " ".join(shlex.quote(p) for p in parts)
