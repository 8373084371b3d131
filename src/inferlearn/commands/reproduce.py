"""``inferlearn reproduce lifted --table N``: the tables of the lifted-network paper."""
from __future__ import annotations

import shlex

from .common import add_threads_option, set_threads
from ..units import get_units
from ..experiments.lifted_tables import ACTS, ROWS, TABLES, reproduce_table


def register(sub) -> None:
    p = sub.add_parser("reproduce", help="reproduce a paper's tables (lifted: Zach & Estellers 2019, Tables 1-4)")
    p.add_argument("paper", choices=["lifted"], help="which paper")
    p.add_argument("--table", type=int, default=None, choices=sorted(TABLES), help="table number")
    p.add_argument("--figure", type=int, default=None, choices=[1],
                   help="instead of a table: Fig. 1, first-layer filters of BP, contrastive and standard lifted on "
                        "MNIST 784-64-64-10 (writes OUT/figure1/)")
    p.add_argument("--alignment", action="store_true",
                   help="instead of a table: sweep γ and compare contrastive gradients with back-propagation's "
                        "(writes OUT/alignment.md)")
    p.add_argument("--alignment-rules", default="contrastive",
                   help="with --alignment: comma-separated rules to compare with back-propagation, contrastive "
                        "and/or lifted-j0 (default %(default)s)")
    p.add_argument("--gammas", default=None,
                   help="with --alignment: comma-separated feedback weights, fractions allowed "
                        "(default 1,1/2,1/8,1/32,1/128)")
    p.add_argument("--duality", action="store_true",
                   help="instead of a table: strong duality and free-energy scoring per unit type (writes OUT/duality.md)")
    p.add_argument("--epochs", type=int, default=None, help="training epochs (default: the paper's, 100 or 50)")
    p.add_argument("--acts", default=",".join(ACTS), help="comma-separated unit types (default %(default)s)")
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated rules (default: all four rows)")
    p.add_argument("--gamma", default="1/8", help="feedback weight, a number or a fraction (default 1/8)")
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
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"],
                   help="floating-point type of the tables' and Fig. 1's runs (default %(default)s; the same initial weights either way; --alignment and --duality always use float64)")
    p.add_argument("--progress", action="store_true", help="show progress bars")
    add_threads_option(p)
    p.set_defaults(func=run)


def run(args) -> int:
    set_threads(args.threads)
    modes = [flag for flag, given in (("--table", args.table is not None), ("--figure", args.figure is not None),
                                      ("--alignment", args.alignment), ("--duality", args.duality)) if given]
    if len(modes) > 1:   # one of them used to be dropped silently
        raise ValueError(f"{' and '.join(modes)} given together; reproduce one at a time: --table N, --figure 1, "
                         "--alignment or --duality")
    args.gamma = _gamma(args.gamma, "--gamma")
    if args.alignment:
        from pathlib import Path

        from ..atomic import write_text
        from ..experiments.lifted_tables import alignment_report

        from ..experiments.alignment import SWEEP_RULES

        rules = [r.strip() for r in args.alignment_rules.split(",") if r.strip()]
        for r in rules:
            if r not in SWEEP_RULES:
                raise ValueError(f"Unknown rule {r!r} for --alignment-rules; choose from {list(SWEEP_RULES)}")
        gammas = _gammas(args.gammas) if args.gammas else (1.0, 1 / 2, 1 / 8, 1 / 32, 1 / 128)
        parts = ["inferlearn", "reproduce", "lifted", "--alignment", "--limit-train", str(args.limit_train or 10000)]
        if args.alignment_rules != "contrastive":
            parts += ["--alignment-rules", ",".join(rules)]
        if args.gammas:
            parts += ["--gammas", args.gammas]
        cmd = " ".join(shlex.quote(p) for p in parts + ["--out", args.out])
        md = alignment_report(limit_train=args.limit_train or 10000, data_dir=args.data_dir, seed=args.seed,
                              gammas=gammas, rules=rules, png=Path(args.out) / "alignment.png", command=cmd)
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
    if args.table is None and args.figure is None:
        raise ValueError("Give --table N (1-4), --figure 1, --alignment or --duality")
    if args.epochs is not None and args.epochs < 1:
        raise ValueError(f"Invalid epochs: {args.epochs}")
    for act in args.acts.split(","):   # every option before the first row trains (the rows check their own)
        if act.strip():
            get_units(act.strip())
    if args.figure is not None:
        from ..experiments.lifted_tables import FIGURE1_ROWS, reproduce_figure1

        acts = [a.strip() for a in args.acts.split(",") if a.strip()]
        rows = [r.strip() for r in args.rows.split(",") if r.strip()]
        if args.rows == ",".join(ROWS):
            rows = list(FIGURE1_ROWS)
        if args.acts == ",".join(ACTS):
            acts = ["relu"]   # the paper's Fig. 1 is a ReLU network
        for act in acts:
            md = reproduce_figure1(args.out, epochs=args.epochs, act=act, rows=rows, gamma=args.gamma, lr=args.lr,
                                   batch_size=args.batch_size, seed=args.seed, data_dir=args.data_dir,
                                   limit_train=args.limit_train, solver=args.solver, dtype=args.dtype,
                                   command=_command(args, acts=",".join(acts), rows=",".join(rows)),
                                   progress=args.progress)
            print(md)
        return 0
    md = reproduce_table(args.table, args.out, epochs=args.epochs,
                         acts=[a.strip() for a in args.acts.split(",") if a.strip()],
                         rows=[r.strip() for r in args.rows.split(",") if r.strip()], gamma=args.gamma, lr=args.lr,
                         batch_size=args.batch_size, seed=args.seed, data_dir=args.data_dir,
                         limit_train=args.limit_train, solver=args.solver,
                         allow_unverified=args.allow_unverified, dtype=args.dtype, command=_command(args),
                         progress=args.progress)
    print(md)
    return 0


def _gammas(text: str) -> tuple[float, ...]:
    """Parse ``1,1/2,0.125`` into positive floats (a bad value ends with a one-line error)."""
    return tuple(_gamma(t, "--gammas") for t in text.split(","))


def _gamma(text: str, flag: str) -> float:
    """Parse one positive feedback weight, ``0.125`` or ``1/8``; a bad value ends with a one-line error."""
    t = str(text).strip()
    try:
        num, _, den = t.partition("/")
        g = float(num) / float(den) if den else float(num)
    except (ValueError, ZeroDivisionError):
        g = float("nan")
    if not g > 0 or g == float("inf"):
        raise ValueError(f"Invalid gamma {t!r} in {flag}; give a positive number or fraction, e.g. 1/8")
    return g


def _command(args, acts: str | None = None, rows: str | None = None) -> str:
    """The command line that reproduces this run, with every setting explicit."""
    parts = ["inferlearn", "reproduce", "lifted"]
    parts += ["--figure", str(args.figure)] if args.figure is not None else ["--table", str(args.table)]
    if args.epochs is not None:
        parts += ["--epochs", str(args.epochs)]
    for flag, value in (("--acts", acts or args.acts), ("--rows", rows or args.rows), ("--gamma", f"{args.gamma:g}"),
                        ("--lr", f"{args.lr:g}"), ("--batch-size", str(args.batch_size)), ("--seed", str(args.seed)),
                        ("--solver", args.solver), ("--limit-train", args.limit_train), ("--out", args.out)):
        if value is not None:
            parts += [flag, str(value)]
    if args.allow_unverified:
        parts.append("--allow-unverified")
    if getattr(args, "dtype", "float32") != "float32":
        parts += ["--dtype", args.dtype]
    return " ".join(shlex.quote(p) for p in parts)
