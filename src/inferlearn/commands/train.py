"""``inferlearn train``: train one network with one rule."""
from __future__ import annotations

from ..training.compare import parse_rule_options
from ..training.config import TrainConfig
from ..rules import RULES
from ..training.loop import load_config, train
from .common import add_training_options, check_device, config_from_args


def register(sub) -> None:
    p = sub.add_parser("train", help="train a network with one learning rule")
    add_training_options(p)
    p.add_argument("--rule", default="backprop", help=f"learning rule: {', '.join(sorted(RULES))}")
    p.add_argument("--rule-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="rule hyper-parameter, repeatable (e.g. --rule-opt gamma=1/8)")
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its last checkpoint")
    p.set_defaults(func=run, epochs=None)


def run(args) -> int:
    if args.resume:
        config = load_config(args.resume)
        if args.epochs is not None:  # resume and extend (or shorten) the run
            config = config.replace(epochs=args.epochs)
        check_device(config.device)
        config = config.replace(out=args.resume)
        resume = True
    else:
        args.epochs = args.epochs or TrainConfig().epochs
        options = parse_rule_options([f"{args.rule}.{o}" for o in args.rule_opt]).get(args.rule, {})
        config = config_from_args(args, rule=args.rule, rule_options=options)
        resume = False
    history = train(config, progress=not args.quiet, resume=resume)
    last = history[-1] if history else {}
    print(f"done: test accuracy {last.get('test_acc', float('nan')):.4f}; results in {config.out}")
    return 0
