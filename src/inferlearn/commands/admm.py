"""``inferlearn admm``: train a network split into blocks with stochastic block-ADMM.

Examples::

    inferlearn admm --data mnist --arch 784-256-256-10 --epochs 10 --out runs/admm
    inferlearn admm --data mnist --arch conv:16-32 --mode online --shift 2 --z-steps 2 --out runs/admm-online
    inferlearn admm --data mnist --arch 784-256-64-10 --nmf-rank 32 --nmf-after 1 --out runs/deepfacto
    inferlearn admm --resume runs/admm --epochs 20      # continue (or extend) exactly

Writes ``config.json``, ``metrics.jsonl`` and ``checkpoint.pt`` (blocks, optimisers, Z, U, duals,
penalties, RNG) into ``--out`` like ``inferlearn train``.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from ..admm import ADMMConfig, BlockADMM, RunData, random_shift, train_admm
from ..admm.config import ADMM_LOSSES
from ..admm.blocks import check_blocks, conv_net, mlp, split_sequential
from ..engine.graph import is_activation
from ..models.activations import ACTIVATIONS
from ..data import DATASETS, load_dataset
from ..training.run_folder import RunFolder
from ..distributed import check_nproc, join, world_from_env
from .common import (add_parallel_options, add_threads_option, check_data_dir, check_device, check_tensorboard,
                     explicit_options, remember_defaults, run_parallel, set_threads)
from ..admm.nmf import NMF

RUN_KEYS = ("data", "arch", "act", "split", "mode", "batch_size", "optimizer", "lr", "momentum", "beta", "zeta",
            "z_steps", "primal_steps", "primal_growth", "primal_schedule", "formulation", "adaptive", "eta0", "eta_decay", "penalty_growth",
            "loss", "seed", "device", "data_dir", "limit_train", "memmap", "shift", "nmf_rank", "nmf_after",
            "chunk_size", "allow_unverified", "z_schedule")


def register(sub) -> None:
    p = sub.add_parser("admm", help="train a network in blocks with stochastic block-ADMM (batch or online)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="mnist", help=f"dataset: {', '.join(DATASETS)} (default %(default)s)")
    p.add_argument("--arch", default="784-256-256-10",
                   help="MLP widths (784-256-256-10) or conv:C1-C2 for the small conv net (default %(default)s)")
    p.add_argument("--act", default="relu", help=f"activation: {', '.join(ACTIVATIONS)} (as for train)")
    p.add_argument("--split", default=None,
                   help="comma-separated module indices where blocks start (default: before every activation that follows a weight layer)")
    p.add_argument("--mode", default="batch", choices=["batch", "online"])
    p.add_argument("--epochs", type=int, default=None, help="outer iterations (default 10)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--optimizer", default="adam", choices=["sgd", "adam"])
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--beta", default="1", help="penalty β_t (online: ρ_t), one value or one per constraint, comma-separated")
    p.add_argument("--zeta", default="0.5", help="Z step size ζ_t, one value or one per constraint")
    p.add_argument("--z-steps", type=int, default=1)
    p.add_argument("--primal-steps", type=int, default=1)
    p.add_argument("--primal-growth", type=float, default=0.0, help="extra primal passes per iteration")
    p.add_argument("--primal-schedule", default="linear", choices=["linear", "proposition"],
                   help="primal passes per iteration: linear (--primal-steps + ⌊growth·k⌋) or proposition "
                        "(⌈primal_steps · eta_decay^(-2k)⌉, Proposition 1's growing accuracy; batch mode)")
    p.add_argument("--formulation", default="default", choices=["default", "paper"],
                   help="default: loss on f_T(Z_{T-1}); paper: a Z_T on the output with J(Z_T, Y) (batch mode; "
                        "--beta/--zeta then take T values)")
    p.add_argument("--adaptive", action="store_true", help="adaptive penalty (Shi et al. 2017)")
    p.add_argument("--eta0", type=float, default=1.0)
    p.add_argument("--eta-decay", type=float, default=0.9)
    p.add_argument("--penalty-growth", type=float, default=2.0)
    p.add_argument("--loss", default="cross-entropy", choices=[x for x in ADMM_LOSSES if x != "mse"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--allow-unverified", action="store_true",
                   help="read data files whose checksums differ from the published ones (with a warning)")
    p.add_argument("--limit-train", type=int, default=None, help="use only the first N training samples")
    p.add_argument("--memmap", action="store_true", help="keep Z and U in memory-mapped files in OUT/state")
    p.add_argument("--shift", type=int, default=0, help="online mode: random shifts of up to this many pixels")
    p.add_argument("--nmf-rank", type=int, default=None, help="insert a DeepFacto NMF module of this rank")
    p.add_argument("--nmf-after", type=int, default=1, help="insert the NMF module after this block")
    p.add_argument("--chunk-size", type=int, default=4096)
    p.add_argument("--out", default="runs/admm")
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its last checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace a run that --out already holds")
    p.add_argument("--quiet", action="store_true")
    add_threads_option(p)
    p.add_argument("--z-schedule", default=None, choices=["gauss-seidel", "jacobi"],
                   help="Z update order: the reverse Gauss-Seidel sweep (default with one process) or Jacobi, all Z_t "
                        "at once (default and required with --nproc > 1, where each block has its own process)")
    add_parallel_options(p)
    p.add_argument("--tensorboard", metavar="DIR", default=None,
                   help="log scalars, weight histograms and first-layer filters to DIR")
    p.set_defaults(func=run)
    remember_defaults("admm", p)


def _floats(text: str, option: str = "value") -> float | list[float]:
    try:
        vals = [float(v) for v in str(text).split(",")]
    except ValueError:
        raise ValueError(f"Invalid --{option} {text!r}: expected a number or comma-separated numbers, e.g. 1 or 1,2") from None
    return vals[0] if len(vals) == 1 else vals


def build_blocks(args, image_shape, n_classes) -> list[torch.nn.Module]:
    """The network of ``--arch`` split at ``--split``, with an NMF module if ``--nmf-rank`` is set."""
    if args.arch.startswith("conv"):
        try:
            chans = [int(c) for c in args.arch.split(":", 1)[1].split("-")] if ":" in args.arch else [16, 32]
        except ValueError:
            chans = []
        if not chans or min(chans) < 1:
            raise ValueError(f"Invalid --arch {args.arch!r}: expected conv:C1-C2 with positive channel counts, "
                             "e.g. conv:16-32") from None
        C, H, _ = image_shape
        net = conv_net(chans, n_classes, in_channels=C, image_size=H, act=args.act, seed=args.seed)
    else:
        net = mlp(args.arch, act=args.act, seed=args.seed)
    try:
        points = None if args.split in (None, "") else [int(p) for p in str(args.split).split(",")]
    except ValueError:
        raise ValueError(f"Invalid --split {args.split!r}: give comma-separated module indices, e.g. --split 2,4") from None
    blocks: list[torch.nn.Module] = list(split_sequential(net, points))
    shapes = check_blocks(blocks, image_shape)
    if shapes[-1] != (n_classes,):
        raise ValueError(f"The network outputs shape {shapes[-1]} but {args.data} has {n_classes} classes")
    if args.nmf_rank is not None:
        k = args.nmf_after
        if not 1 <= k <= len(blocks) - 1:
            raise ValueError(f"Invalid --nmf-after {k}: must lie in 1..{len(blocks) - 1} (between two blocks)")
        nxt = blocks[k]
        if len(nxt) > 1 and is_activation(nxt[0]):
            # NMF factorises non-negative activations: move the activation that starts the next
            # block (default splits are at pre-activations) to the end of block k.
            blocks[k - 1] = torch.nn.Sequential(*blocks[k - 1], nxt[0])
            blocks[k] = nxt = torch.nn.Sequential(*list(nxt)[1:])
            shapes = check_blocks(blocks, image_shape)
        n = int(torch.tensor(shapes[k - 1]).prod())
        nmf = NMF(n, args.nmf_rank, seed=args.seed)
        first = next(m for m in nxt.modules() if isinstance(m, torch.nn.Linear))
        # The next block sees only S (rank r): replace its first linear layer's input width.
        if first.in_features != n:
            raise ValueError("--nmf-rank needs the block after the NMF module to start with a Linear layer "
                             f"on the flattened {n} features")
        torch.manual_seed(args.seed)
        new = torch.nn.Linear(args.nmf_rank, first.out_features)
        for name, m in nxt.named_modules():
            for cname, child in m.named_children():
                if child is first:
                    setattr(m, cname, new)
        blocks.insert(k, nmf)
        check_blocks(blocks, image_shape)
    return blocks


def run(args) -> int:
    check_nproc(args.nproc)
    set_threads(args.threads)
    resume = args.resume is not None
    if resume and not args.resume.strip():
        raise ValueError("Invalid --resume '': give the run folder to continue, e.g. --resume runs/admm")
    if resume:
        # read only: every process of a launched run gets here (rank 0 alone writes, in train_admm)
        folder = RunFolder(args.resume, writer=False) if Path(args.resume).is_dir() else None
        if folder is None:
            raise ValueError(f"Run folder {args.resume} does not exist; check the path given to --resume")
        saved = folder.read_config()
        if "run" not in saved:
            raise ValueError(f"{folder.path / 'config.json'} is not the config of an `inferlearn admm` run "
                             "(a train run folder? resume it with `inferlearn train --resume`)")
        given = explicit_options(args) - {"epochs", "quiet", "resume", "tensorboard", "threads", "nproc", "dist_timeout"}
        if given:
            flags = ", ".join("--" + g.replace("_", "-") for g in sorted(given))
            raise ValueError(f"{flags} given with --resume: a resumed run keeps the settings of "
                             f"{folder.path / 'config.json'}; drop {flags}, or start a new run with another --out")
        for key in RUN_KEYS:
            setattr(args, key, saved["run"].get(key, getattr(args, key, None)))
        args.epochs = args.epochs if args.epochs is not None else saved["epochs"]
        args.out = args.resume
        if not folder.checkpoint_path.exists():
            print(f"note: {folder.path} has no checkpoint yet; starting the run from scratch")
            resume = False
    if not args.out:
        raise ValueError("Invalid --out '': give a folder name, e.g. --out runs/admm")
    # checked before the run folder is created: a refused command writes nothing
    if args.epochs is not None and args.epochs < 1:
        raise ValueError(f"Invalid --epochs {args.epochs}: must be ≥ 1")
    if args.limit_train is not None and args.limit_train < 1:
        raise ValueError(f"Invalid --limit-train {args.limit_train}: must be ≥ 1 (or leave it out for every sample)")
    if not 0 <= args.seed < 2 ** 63:   # torch's generators take 64-bit seeds
        raise ValueError(f"Invalid --seed {args.seed}: must be an integer in 0 … 2**63 - 1")
    check_device(args.device)
    check_data_dir(args.data_dir)
    check_tensorboard(args.tensorboard)
    # this process (one-process run, or the launcher of a --nproc run) locks the folder for the whole run;
    # in a launched run rank 0 alone checks (and writes), under its launcher's lock
    held = RunFolder(args.out) if os.environ.get("RANK", "0") == "0" else None
    try:
        return _run(args, resume, held)
    finally:
        if held is not None:
            held.close()


def _run(args, resume: bool, held: RunFolder | None) -> int:
    if args.resume is None and held is not None:
        held.refuse_overwrite(args.overwrite)
    parallel = args.nproc > 1 or world_from_env() > 1
    if args.z_schedule is None:
        args.z_schedule = "jacobi" if parallel else "gauss-seidel"
    if parallel and resume and args.z_schedule != "jacobi":
        raise ValueError(f"{args.resume} was trained with the {args.z_schedule} Z schedule; a block-parallel run needs "
                         "jacobi: resume it with --nproc 1")
    if parallel and args.memmap:
        raise ValueError("--memmap is for one process; a block-parallel run already splits Z and U over its processes")
    args.epochs = 10 if args.epochs is None else args.epochs
    if args.epochs < 1:
        raise ValueError(f"Invalid --epochs {args.epochs}: must be ≥ 1")
    ds = load_dataset(args.data, data_dir=args.data_dir, allow_unverified=args.allow_unverified)
    shape = tuple(ds.image_shape)
    tx, ty = ds.train_x, ds.train_y
    if args.limit_train is not None:
        tx, ty = tx[:args.limit_train], ty[:args.limit_train]
    data = RunData(tx.reshape(-1, *shape), ty, ds.test_x.reshape(-1, *shape), ds.test_y,
                   transform=random_shift(args.shift, shape) if args.shift > 0 else None)
    if args.shift > 0 and args.mode != "online":
        raise ValueError("--shift (augmentation) needs --mode online: batch mode keeps Z for fixed samples")
    blocks = [b.to(args.device) for b in build_blocks(args, shape, ds.n_classes)]
    cfg = ADMMConfig(mode=args.mode, batch_size=args.batch_size, optimizer=args.optimizer, lr=args.lr,
                     momentum=args.momentum, beta=_floats(args.beta, "beta"), zeta=_floats(args.zeta, "zeta"), z_steps=args.z_steps,
                     primal_steps=args.primal_steps, primal_growth=args.primal_growth,
                     primal_schedule=args.primal_schedule, formulation=args.formulation, adaptive=args.adaptive,
                     eta0=args.eta0, eta_decay=args.eta_decay, penalty_growth=args.penalty_growth, loss=args.loss,
                     seed=args.seed, chunk_size=args.chunk_size, z_schedule=args.z_schedule)
    if args.nproc > 1:   # checked once here, then the processes start
        from ..admm.parallel import check_block_parallel

        check_block_parallel(cfg, blocks, args.nproc)
        return run_parallel(args, args.out)
    if world_from_env() > 1:
        from ..admm.parallel import BlockParallelADMM

        trainer = BlockParallelADMM(blocks, cfg, join(args.device, args.dist_timeout))
    else:
        trainer = BlockADMM(blocks, cfg, memmap_dir=Path(args.out) / "state" if args.memmap else None)
    run_cfg = {"run": {k: getattr(args, k) for k in RUN_KEYS}, "threads": torch.get_num_threads(),
               "nproc": world_from_env(),
               "blocks": [repr(b) for b in blocks]}
    history = train_admm(trainer, data, args.epochs, out=args.out, resume=resume, progress=not args.quiet,
                         run_config=run_cfg, log=None if args.quiet else print, tensorboard=args.tensorboard)
    if hasattr(trainer, "group"):
        trainer.group.close()
        if not trainer.is_main:
            return 0
    last = history[-1] if history else {}
    mem = trainer.memory_bytes()
    print(f"done: test accuracy {last.get('test_acc', float('nan')):.4f}; Z/U state {mem['state_bytes'] / 2**20:.1f} MiB"
          f"{' on disk' if mem['state_on_disk'] else ''}; results in {args.out}")
    return 0
