"""``inferlearn train``: train one network with one rule."""
from __future__ import annotations

import os

import torch

from ..rules import RULES, make_rule
from ..training.compare import parse_rule_options
from ..training.config import TrainConfig
from ..training.loop import load_config, train
from ..distributed import check_nproc, world_from_env
from ..training.run_folder import RunFolder
from .common import (add_parallel_options, add_training_options, check_device, check_tensorboard, config_from_args,
                     explicit_options, remember_defaults, run_parallel, set_threads)

# what may accompany --resume: the run's length, where it runs, and how much it prints
RESUME_OPTIONS = {"epochs", "device", "quiet", "resume", "tensorboard", "threads", "compile", "nproc", "dist_timeout",
                  "check_equilibrium"}


def register(sub) -> None:
    p = sub.add_parser("train", help="train a network with one learning rule")
    add_training_options(p)
    p.add_argument("--rule", default="backprop", help=f"learning rule: {', '.join(sorted(RULES))}")
    p.add_argument("--rule-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="rule hyper-parameter, repeatable (e.g. --rule-opt gamma=1/8)")
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its last checkpoint "
                   "(its settings come from DIR/config.json; --epochs extends it)")
    p.add_argument("--overwrite", action="store_true", help="replace a run that --out already holds")
    add_parallel_options(p)
    p.set_defaults(func=run, epochs=None)
    remember_defaults("train", p)


def run(args) -> int:
    check_nproc(args.nproc)
    if args.resume is not None and not args.resume.strip():
        raise ValueError("Invalid --resume '': give the run folder to continue, e.g. --resume runs/train")
    if args.resume:
        given = explicit_options(args) - RESUME_OPTIONS
        if given:
            flags = ", ".join("--" + g.replace("_", "-") for g in sorted(given))
            raise ValueError(f"{flags} given with --resume: a resumed run keeps the settings of "
                             f"{args.resume}/config.json; drop {flags}, or start a new run with another --out")
        set_threads(args.threads)
        config = load_config(args.resume)
        if args.epochs is not None:  # resume and extend (or shorten) the run
            config = config.replace(epochs=args.epochs)
        if "device" in explicit_options(args):
            config = config.replace(device=args.device)
        if args.tensorboard:
            check_tensorboard(args.tensorboard)
            config = config.replace(tensorboard=args.tensorboard)
        if "compile" in explicit_options(args):
            config = config.replace(compile=args.compile)
        if args.check_equilibrium:
            config = config.replace(check_equilibrium=True)
        config = config.replace(threads=torch.get_num_threads())
        check_device(config.device)
        config = config.replace(out=args.resume, dist_timeout=args.dist_timeout)
        resume = True
    else:
        args.epochs = TrainConfig().epochs if args.epochs is None else args.epochs
        for item in args.rule_opt:
            key, sep, _ = item.partition("=")
            if not sep or not key:
                raise ValueError(f"Invalid --rule-opt {item!r}: expected KEY=VALUE, e.g. --rule-opt gamma=1/8")
        options = parse_rule_options([f"{args.rule}.{o}" for o in args.rule_opt]).get(args.rule, {})
        config = config_from_args(args, rule=args.rule, rule_options=options)
        resume = False
    if config.check_equilibrium and make_rule(config.rule, config.rule_options).equilibrium_options() is None:
        raise ValueError(f"--check-equilibrium with --rule {config.rule}: its gradient stands for no inference equilibrium "
                         "(back-propagation's is exact; the lifted and contrastive rules solve to a tolerance; ePC's "
                         "defaults stand for back-propagation's direction); drop --check-equilibrium, or use pc, mac, "
                         "lpom or lifted-fenchel")
    if args.nproc > 1:
        # the launcher locks the folder for the whole run (its processes work under its lock)
        with RunFolder(config.out) as folder:
            if not resume and not args.overwrite:   # refused here, once, rather than by every process
                folder.refuse_overwrite(False)
            return run_parallel(args, config.out)
    config = config.replace(nproc=world_from_env())
    history = train(config, progress=not args.quiet, resume=resume, overwrite=args.overwrite)
    if os.environ.get("RANK", "0") != "0":   # the other ranks of a data-parallel run stay silent
        return 0
    last = history[-1] if history else {}
    print(f"done: test accuracy {last.get('test_acc', float('nan')):.4f}; results in {config.out}")
    return 0
