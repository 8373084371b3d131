"""Options shared by the training subcommands (train, compare, reproduce)."""
from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path

import torch

from ..engine.compiled import COMPILE_MODES
from ..errors import InferlearnWarning
from ..models import ZOO
from ..data.transforms import AUGMENT, COLOUR_SETS, STANDARDIZE
from ..training.config import OPTIMIZERS, TrainConfig
from ..units import UNIT_SETS
from ..data import DATASETS


def add_training_options(p: argparse.ArgumentParser, defaults: TrainConfig = TrainConfig()) -> None:
    """Data, architecture, optimiser, seed, device and output options with ``defaults``."""
    p.add_argument("--data", default=defaults.data, help=f"dataset: {', '.join(DATASETS)} (default %(default)s)")
    p.add_argument("--arch", default=defaults.arch,
                   help="MLP widths (784-64-64-64-10), a conv net (conv:16-32 or conv:16-32/64: conv channels, then "
                        f"dense widths), a zoo model ({', '.join(ZOO)}; options as NAME:KEY=VALUE,..., e.g. "
                        "vgg5:width=0.125,pool=avg or resmlp:depth=64,param=mupc; act= overrides --act) or your own "
                        "model (package.module:function) (default %(default)s)")
    p.add_argument("--act", default=defaults.act, help=f"hidden units: {', '.join(UNIT_SETS)} (default %(default)s)")
    p.add_argument("--epochs", type=int, default=defaults.epochs)
    p.add_argument("--batch-size", type=int, default=defaults.batch_size)
    p.add_argument("--optimizer", default=defaults.optimizer, choices=list(OPTIMIZERS),
                   help="sgd, adam or adamw (decoupled weight decay) (default %(default)s)")
    p.add_argument("--weight-decay", type=float, default=defaults.weight_decay, metavar="W",
                   help="weight decay: an L2 term W·w in the gradient for sgd and adam, decoupled for adamw "
                        "(default %(default)s)")
    p.add_argument("--lr", type=float, default=defaults.lr,
                   help="learning rate (default: the rule's recommended rate for the optimizer, recorded in config.json)")
    p.add_argument("--momentum", type=float, default=defaults.momentum)
    p.add_argument("--lr-schedule", default=defaults.lr_schedule,
                   help="constant, warmup (5 epochs at 0.1×lr, then 0.3×lr), warmup:E:F:A (E epochs at F×lr, then A×lr) "
                        "scaled:F, cosine or cosine:W (W epochs of linear warm-up, then a cosine decay to the last "
                        "epoch), or warmup-cosine:P:W:F (per step: warm-up from lr to P×lr over the fraction W of the steps, "
                        "cosine to F×lr; warmup-cosine alone is PCX's 1.1:0.1:0.1) (default %(default)s)")
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--init-scale", type=float, default=defaults.init_scale, help="weights ~ N(0, s²/fan_in) (MLP widths only)")
    p.add_argument("--device", default=defaults.device, help="cpu (default) or cuda")
    p.add_argument("--dtype", default=defaults.dtype, choices=["float32", "float64"],
                   help="floating-point type of the model and inputs (default %(default)s; float64 for deep "
                        "contrastive or EqProp networks at small gamma, see PrecisionWarning)")
    p.add_argument("--data-dir", default=None, help="folder searched first for dataset files")
    p.add_argument("--allow-unverified", action="store_true",
                   help="read data files whose checksums differ from the published ones (with a warning)")
    p.add_argument("--standardize", default=defaults.standardize, choices=list(STANDARDIZE),
                   help="per-channel standardisation with the training split's mean and std: auto (default: on for "
                        f"{', '.join(COLOUR_SETS)}, off elsewhere), on, off")
    p.add_argument("--augment", default=defaults.augment, choices=list(AUGMENT),
                   help="training-batch augmentation: none (default) or crop-flip (random crop from a 4-pixel zero "
                        "padding and a left-right flip, seeded by --seed; refused on digits and mnist, whose mirror "
                        "images are not digits, unless given as crop-flip:force)")
    p.add_argument("--limit-train", type=int, default=None, help="use only the first N training samples")
    p.add_argument("--val", type=int, default=defaults.val_size, metavar="N", dest="val_size",
                   help="hold out the last N training images as a validation split, reported as val_acc (default 0: none)")
    p.add_argument("--out", default=defaults.out, help="output folder (default %(default)s)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_threads_option(p)
    add_compile_option(p)
    p.add_argument("--check-equilibrium", action="store_true",
                   help="after every epoch, measure on 32 training images how far the rule's gradient is from the one "
                        "at its inference's equilibrium (equilibrium_gap in metrics.jsonl; warns once above 10%%): PC, "
                        "MAC, LPOM, lifted-fenchel; one 3000-step solve per epoch")
    p.add_argument("--tensorboard", metavar="DIR", default=None,
                   help="log scalars, weight histograms and first-layer filters to DIR (tensorboard --logdir DIR)")


def add_compile_option(p: argparse.ArgumentParser) -> None:
    """``--compile MODE``: compile each rule's inference step (``TrainConfig.compile``)."""
    p.add_argument("--compile", nargs="?", const="on", default="auto", choices=list(COMPILE_MODES),
                   help="compile each rule's inference step with torch.compile: auto (default: on for CUDA; on CPU "
                        "only predictive coding's and ePC's steps, in runs long enough to repay compiling: 10,000 "
                        "mini-batches for a dense network, 500 for a graph, where the step measured faster is kept: compiled "
                        "and eager round differently, so two fresh runs can differ; on or off for identical reruns), on "
                        "(the same as --compile alone; CUDA graphs on CUDA; a rule with no compiled step warns), "
                        "no-cudagraphs, off")


def add_threads_option(p: argparse.ArgumentParser) -> None:
    """``--threads N``: PyTorch's intra-op threads (default 1, see :func:`set_threads`)."""
    p.add_argument("--threads", type=int, default=None,
                   help="intra-op threads (default 1: the default thread count collapses beside a busy core)")


def add_parallel_options(p: argparse.ArgumentParser) -> None:
    """``--nproc N`` (data- or block-parallel processes on this machine) and ``--dist-timeout S``."""
    p.add_argument("--nproc", type=int, default=1,
                   help="processes to run in parallel on this machine, joined by torch.distributed over "
                        "loopback (default 1; torchrun works too)")
    p.add_argument("--dist-timeout", type=float, default=120.0, metavar="S",
                   help="seconds a process waits for the others before the run fails (default %(default)s)")


def run_parallel(args, out: str) -> int | None:
    """Start ``args.nproc`` copies of this command when asked (``None``: run here, in this process)."""
    from ..distributed import check_nproc, launch, strip_nproc

    if check_nproc(args.nproc) == 1:
        return None
    if not args.dist_timeout > 0:
        raise ValueError(f"Invalid --dist-timeout {args.dist_timeout}: must be > 0 seconds")
    return launch(strip_nproc(args.argv), args.nproc, resume_hint=resume_hint(args))


def resume_hint(args) -> str:
    """How to continue the run of a stopped command, naming its folder ('' when there is nothing to continue)."""
    command = getattr(args, "command", None)
    if command in ("train", "admm"):
        folder = getattr(args, "resume", None) or getattr(args, "out", None)
        return f"if the run had started, continue it with `inferlearn {command} --resume {folder}` (any --nproc)"
    if command == "compare":
        return f"run the same command again to continue (it resumes the runs in {args.out})"
    if command == "benchmark":
        return ("run the same command again to continue (finished runs are skipped, the interrupted one resumes "
                "from its last checkpoint)")
    return ""


def set_threads(threads: int | None) -> int:
    """Set PyTorch's intra-op thread count and return it; ``None`` means 1.

    One thread is the default because PyTorch's own default (one per core) collapses when another
    process holds a core, and gains nothing on the small models here: on the MNIST MLP, 2 threads
    instead of 1 took 1.06× (back-propagation) and 1.10× (predictive coding) as long on a quiet 2-core
    machine, and 4.5× and 3.8× beside one busy core, where 1 thread was unaffected
    (``python benchmarks/bench_threads.py``, ``benchmarks/results/threads.md``). Ask for more with
    ``--threads N``; more than the machine's cores warns (:class:`~inferlearn.errors.InferlearnWarning`).
    """
    n = 1 if threads is None else threads
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"Invalid --threads {threads}: must be an integer ≥ 1")
    cores = os.cpu_count() or 1
    if n > cores:   # oversubscribed threads wait on each other: 100x slower at --threads 1000 on 2 cores
        warnings.warn(f"--threads {n} is more than this machine's {cores} cores: the threads wait on each other and "
                      f"the run is slower, not faster; use --threads {cores} or fewer", InferlearnWarning, stacklevel=2)
    torch.set_num_threads(n)
    return n


def check_device(device: str) -> None:
    """Raise ``ValueError`` for a device this machine cannot run (one line naming it and the fix)."""
    if device != "cpu" and not device.startswith("cuda"):
        raise ValueError(f"Unsupported device {device!r}; use --device cpu or --device cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"Device {device!r} requested but CUDA is not available; use --device cpu")


def check_tensorboard(folder: str | None) -> None:
    """Raise ``ValueError`` when ``--tensorboard`` names a folder that cannot be written (a file, /proc/...),
    before the run writes anything."""
    if folder is None:
        return
    if not str(folder).strip():
        raise ValueError("Invalid --tensorboard '': give a folder, e.g. --tensorboard runs/tb")
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--tensorboard {folder} is a file; give a folder for the TensorBoard logs")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"Cannot write TensorBoard logs to {folder} ({exc.strerror}); choose another "
                         "--tensorboard") from None


def check_data_dir(data_dir: str | None) -> None:
    """Raise ``ValueError`` when ``--data-dir`` names a folder that does not exist."""
    if data_dir is not None and not Path(data_dir).is_dir():
        raise ValueError(f"--data-dir {data_dir} is not a folder; give the folder that holds the data sets "
                         "(e.g. mnist/, fashion-mnist/)")


def explicit_options(args) -> set[str]:
    """The option names whose values differ from the parser's defaults (those the user gave)."""
    return {k for k, v in vars(args).items() if k in _DEFAULTS.get(args.command, {}) and v != _DEFAULTS[args.command][k]}


_DEFAULTS: dict[str, dict] = {}


def remember_defaults(command: str, parser: argparse.ArgumentParser) -> None:
    """Record a subcommand's defaults, for :func:`explicit_options`."""
    _DEFAULTS[command] = {a.dest: a.default for a in parser._actions if a.dest != "help"}


def config_from_args(args, **overrides) -> TrainConfig:
    set_threads(args.threads)
    check_device(args.device)
    check_data_dir(args.data_dir)
    config = TrainConfig(data=args.data, arch=args.arch, act=args.act, epochs=args.epochs, batch_size=args.batch_size,
                       optimizer=args.optimizer, lr=args.lr, momentum=args.momentum,
                       weight_decay=args.weight_decay, standardize=args.standardize, augment=args.augment, lr_schedule=args.lr_schedule, seed=args.seed,
                       init_scale=args.init_scale, device=args.device, dtype=args.dtype, out=args.out, data_dir=args.data_dir,
                       limit_train=args.limit_train, val_size=args.val_size, allow_unverified=args.allow_unverified,
                       tensorboard=args.tensorboard, threads=torch.get_num_threads(),
                       dist_timeout=getattr(args, "dist_timeout", 120.0), compile=getattr(args, "compile", "auto"),
                       check_equilibrium=getattr(args, "check_equilibrium", False),
                       **overrides)
    check_tensorboard(config.tensorboard)   # after the config's own checks: nothing is written for a bad run
    return config
