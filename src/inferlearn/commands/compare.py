"""``inferlearn compare``: train several rules from the same initial weights, print one table."""
from __future__ import annotations

import shlex

from ..training.compare import compare_rules, parse_rule_options
from ..training.config import TrainConfig
from ..rules import RULES
from .common import add_training_options, config_from_args


def register(sub) -> None:
    p = sub.add_parser("compare", help="train several rules side by side and write a comparison table and plot")
    add_training_options(p, TrainConfig(out="runs/compare"))
    p.add_argument("--rules", default="all", help=f"comma-separated rules or 'all' ({', '.join(sorted(RULES))})")
    p.add_argument("--rule-opt", action="append", default=[], metavar="RULE.KEY=VALUE",
                   help="per-rule hyper-parameter, repeatable (e.g. contrastive.gamma=1/8)")
    p.add_argument("--rule-lr", action="append", default=[], metavar="RULE=LR", help="per-rule learning rate")
    p.add_argument("--overwrite", action="store_true",
                   help="train every rule afresh (default: resume and extend the runs already in --out)")
    p.set_defaults(func=run)


def run(args) -> int:
    rules = sorted(RULES) if args.rules == "all" else [r.strip() for r in args.rules.split(",") if r.strip()]
    if not rules:
        raise ValueError(f"--rules {args.rules!r} names no rule; give e.g. --rules backprop,contrastive or all")
    lrs = {}
    for item in args.rule_lr:
        rule, _, lr = item.partition("=")
        if rule not in RULES:
            raise ValueError(f"Unknown rule {rule!r} in --rule-lr {item!r}; choose one of {sorted(RULES)}")
        try:
            lrs[rule] = float(lr)
        except ValueError:
            raise ValueError(f"Invalid --rule-lr {item!r}: expected RULE=LR, e.g. contrastive=0.05") from None
        if not (lrs[rule] > 0 and lrs[rule] < float("inf")):
            raise ValueError(f"Invalid learning rate: {lrs[rule]} in --rule-lr {item!r}")
    compared = set(rules) | {"backprop"}   # back-propagation always runs, as the reference
    options = parse_rule_options(args.rule_opt)
    for flag, named in (("--rule-lr", lrs), ("--rule-opt", options)):
        idle = sorted(r for r in named if r not in compared)
        if idle:
            raise ValueError(f"{flag} names {', '.join(idle)}, which {'is' if len(idle) == 1 else 'are'} not compared "
                             f"(--rules {args.rules}); add {'it' if len(idle) == 1 else 'them'} to --rules or drop "
                             f"that {flag}")
    base = config_from_args(args)
    command = "inferlearn " + shlex.join(getattr(args, "argv", None) or ["compare", "--rules", args.rules])
    compare_rules(base, rules, options, lrs, progress=not args.quiet,
                  log=None if args.quiet else print, overwrite=args.overwrite, command=command)
    print((__import__("pathlib").Path(base.out) / "comparison.md").read_text())
    print(f"plots: {base.out}/curves.png")
    return 0
