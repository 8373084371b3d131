"""``inferlearn benchmark PROTOCOL``: search hyper-parameters on a validation split, then final runs over seeds."""
from __future__ import annotations

import shlex
from pathlib import Path

import torch

from ..benchmark import PROTOCOLS, Settings, format_plan, load_protocol, parse_budget, run_benchmark
from .common import add_compile_option, add_threads_option, check_data_dir, check_device, set_threads


def register(sub) -> None:
    p = sub.add_parser("benchmark", help="run a benchmark protocol (data × model × rule variants): a seeded search "
                       "on a validation split, then final runs over seeds; writes results.md/json/png")
    p.add_argument("protocol", nargs="?", help=f"a protocol ({', '.join(PROTOCOLS)}) or a JSON file with one")
    p.add_argument("--budget", default="cpu",
                   help="full (the protocol's width and epochs; some need CUDA), cpu (the protocol's CPU preset, "
                        "default), smoke (a quick check that every row runs) or a number F in (0, 1] that scales "
                        "width and epochs")
    p.add_argument("--seeds", type=int, default=5, help="final runs per variant, seeds 0..K-1 (default %(default)s)")
    p.add_argument("--out", default=None, help="output folder (default runs/benchmark/PROTOCOL-BUDGET)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda for a full budget that needs it, else cpu)")
    p.add_argument("--data-dir", default=None, help="folder searched first for dataset files")
    p.add_argument("--allow-unverified", action="store_true",
                   help="read data files whose checksums differ from the published ones (e.g. the colour CIFAR-10 "
                        "development copy); every output says so")
    p.add_argument("--reuse", default=None, metavar="RESULTS_JSON",
                   help="take the search scores and final runs recorded in an earlier results.json of this protocol "
                        "and budget instead of training them again (e.g. a committed table whose run folders are gone; "
                        "REVISION:PATH reads it from this repository's git history); variants whose rule or options "
                        "changed train again, and a grown grid trains only its new points")
    p.add_argument("--variants", default=None, metavar="NAME,NAME",
                   help="run only these variants (comma-separated names; default all): the table holds them, and a "
                        "later run of every variant into the same --out skips the runs already finished")
    p.add_argument("--list", action="store_true", help="list the protocols and exit")
    p.add_argument("--dry-run", action="store_true", help="print the plan (every run, its config and state) and exit")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_threads_option(p)
    add_compile_option(p)
    p.set_defaults(func=run)


def list_protocols() -> str:
    lines = []
    for p in PROTOCOLS.values():
        lines.append(f"{p.name}: {p.summary}\n    data {p.data}, --arch {p.arch}, {len(p.variants)} variants "
                     f"({', '.join(v.name for v in p.variants)}); full budget on {p.full_device}, "
                     f"--budget cpu = {p.cpu.factors}, --budget smoke = {p.smoke_budget.factors}")
    return "\n".join(lines)


def run(args) -> int:
    if args.list:
        print(list_protocols())
        return 0
    if not args.protocol:
        raise ValueError(f"Name a protocol: inferlearn benchmark NAME (one of {', '.join(PROTOCOLS)}), or --list")
    protocol = load_protocol(args.protocol)
    budget = parse_budget(args.budget, protocol)
    full_gpu = budget.width == 1 and budget.epochs == 1 and protocol.full_device == "cuda"
    device = args.device or ("cuda" if full_gpu else "cpu")
    if full_gpu and not args.dry_run and not (device.startswith("cuda") and torch.cuda.is_available()):
        raise ValueError(f"Protocol {protocol.name} at --budget {args.budget} needs a CUDA GPU (and --device cuda), "
                         f"which this machine {'lacks' if not torch.cuda.is_available() else 'was not given'}; "
                         f"on a CPU use --budget cpu ({protocol.cpu.factors}) or a number, e.g. --budget 0.25")
    if not args.dry_run:
        check_device(device)
    check_data_dir(args.data_dir)
    threads = set_threads(args.threads)
    name = Path(args.protocol).stem if args.protocol not in PROTOCOLS else args.protocol
    out = args.out if args.out is not None else f"runs/benchmark/{name}-{budget.name.replace('/', '-')}"
    settings = Settings(out=out, budget=budget, seeds=args.seeds, device=device, data_dir=args.data_dir,
                        allow_unverified=args.allow_unverified, threads=threads, compile=args.compile,
                        reuse=args.reuse,
                        variants=None if args.variants is None else tuple(n.strip() for n in args.variants.split(",")
                                                                         if n.strip()))
    command = "inferlearn " + shlex.join(getattr(args, "argv", None) or ["benchmark", args.protocol])
    if args.dry_run:
        print(format_plan(protocol, settings, command))
        return 0
    results = run_benchmark(protocol, settings, command, progress=not args.quiet, log=print)
    written = Path(results["written"])
    print(written.read_text())
    if written.name == "results.md":
        print(f"results: {out}/results.md, results.json, results.png")
    else:
        print(f"results so far: {written} and .json ({out}/results.md holds a more complete table, kept)")
    return 0
