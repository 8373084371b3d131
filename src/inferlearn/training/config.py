"""Typed, validated training configuration (one frozen dataclass, JSON round-trip, loud on unknown keys)."""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

from ..engine.compiled import check_compile_mode
from ..schema import expect, fits, json_kind
from ..units import get_units
from ..data.datasets import check_name
from ..models import check_arch
from ..data.transforms import AUGMENT, FORCE_FLIP, MIRROR_SENSITIVE, STANDARDIZE, resolve_standardize
from .schedules import check_schedule

OPTIMIZERS = ("sgd", "adam", "adamw")
#: the value a setting had before it existed: a ``config.json`` without the key loads with it (the old behaviour)
LEGACY = {"standardize": "off"}
DTYPES = ("float32", "float64")
#: the largest seed: each epoch's batch order is seeded with ``seed · 100003 + epoch``, which torch's
#: generators take up to 2**64 - 1
MAX_SEED = 2 ** 47 - 1


def check_momentum(optimizer: str, momentum: float) -> None:
    """Refuse a momentum that ``optimizer`` would ignore (only SGD takes one): ``ValueError`` in one line."""
    if momentum and optimizer != "sgd":
        raise ValueError(f"--momentum {momentum:g} has no effect with --optimizer {optimizer} (only sgd uses it; "
                         "Adam's own momentum is built in): drop --momentum, or use --optimizer sgd")


@dataclass(frozen=True)
class TrainConfig:
    """Everything needed to rerun a training run (written to ``config.json``).

    Attributes:
        data: data set name (``digits``, ``mnist``, ``fashion-mnist``, ``cifar10``, ``cifar10-gray``, ``cifar100``,
            ``tiny-imagenet``).
        arch: ``784-64-64-64-10`` (an MLP; the first and last widths must match the data),
            ``conv:16-32/64`` (a conv net), a zoo model (``vgg5``, ``resnet20:width=0.5``,
            ``resmlp:depth=64,param=mupc``, ...) or ``package.module:function`` (your own model); see
            :func:`inferlearn.models.build_model`.
        act: hidden unit type (``relu``, ``hard-sigmoid``, ``hard-tanh``, ``linear``).
        rule: learning rule name (see ``inferlearn.rules.RULES``).
        rule_options: the rule's hyper-parameters, as strings or values.
        epochs, batch_size: training length and mini-batch size.
        optimizer, lr, momentum: ``sgd``, ``adam`` or ``adamw``; learning rate; SGD momentum (refused with the
            other optimisers, which would ignore it). ``lr=None`` (the
            default) takes the rule's recommended rate for the optimiser (:attr:`inferlearn.rules.Rule.recommended_lr`,
            chosen on validation splits by ``benchmarks/tune_defaults.py``; ``adamw`` takes Adam's); a run
            resolves it when it starts (:meth:`resolved`), so ``config.json`` records the number it trained with.
        weight_decay: ``λ ≥ 0``. For ``sgd`` and ``adam`` the L2 term ``λ w`` is added to the gradient
            (torch's ``weight_decay``); for ``adamw`` the decoupled decay ``w ← w − lr · λ · w`` of Loshchilov &
            Hutter (2019). Default 0 (none; ``adamw`` then equals ``adam``).
        lr_schedule: ``constant``, ``warmup``, ``warmup:E:F:A``, ``scaled:F``, ``cosine``, ``cosine:W`` or
            ``warmup-cosine:P:W:F`` (per optimiser step, PCX's)
            (:mod:`inferlearn.training.schedules`).
        standardize: ``auto`` (default), ``on`` or ``off``: per-channel standardisation with the mean and
            standard deviation of the training split the run fits (:mod:`inferlearn.data.transforms`).
            ``auto`` is ``on`` for the colour sets ``cifar10``, ``cifar100``, ``tiny-imagenet`` and ``off``
            elsewhere; a run records the resolved ``on``/``off`` (:meth:`resolved`). A ``config.json``
            written before the option existed loads as ``off``, its behaviour then.
        augment: ``none`` (default) or ``crop-flip``: each training mini-batch is randomly cropped from a
            4-pixel zero padding and flipped left-right, drawn from a generator seeded by the run's seed
            whose state every checkpoint keeps (:class:`inferlearn.data.transforms.CropFlip`). Flips suit
            natural images (CIFAR, Tiny ImageNet, Fashion-MNIST), not digits, whose mirror image may be another
            digit or none: ``crop-flip`` is refused on ``digits`` and ``mnist``
            (:data:`~inferlearn.data.transforms.MIRROR_SENSITIVE`), where ``crop-flip:force`` applies it anyway.
        seed: seeds the weights and the batch order; same seed and config give the same metrics on CPU.
        init_scale: weights ``N(0, init_scale²/fan_in)``, biases 0.
        device: ``cpu`` or ``cuda``.
        dtype: ``float32`` (default) or ``float64``, the model's and the inputs' floating-point type. The
            weights are drawn in float32 either way, so both start from the same network; float64 resolves
            the small two-phase differences of deep contrastive / EqProp networks (``PrecisionWarning``).
        out: output folder.
        data_dir: a folder searched first for data files.
        threads: PyTorch intra-op threads the run used (``--threads``; recorded, not a setting of the maths).
        tensorboard: a TensorBoard log folder (scalars, weight histograms, first-layer filters), or ``None``.
        allow_unverified: read data files whose checksums differ from the published ones (a warning,
            and ``data_verified: false`` in every metrics line), e.g. the grayscale CIFAR-10 copy.
        limit_train: use only the first N training samples (quick runs); ``None`` for all.
        nproc: data-parallel processes the run used (``--nproc``; recorded: the global batch and so the
            maths do not depend on it, and a run may resume with another number).
        dist_timeout: seconds a rank waits for the others in a collective before failing with
            :class:`~inferlearn.errors.DistributedError` (``--dist-timeout``).
        val_size: hold out the *last* N images of the training split as a validation split (``--val N``;
            deterministic, before ``limit_train`` and the shuffling; 0: none). Its accuracy is reported as
            ``val_acc`` in every metrics line; the held-out images are never trained on. Tune on it, not
            on the test split.
        checkpoint_every: write a checkpoint every N epochs (and always after the last).
        compile: compile each rule's inference step with ``torch.compile`` (:mod:`inferlearn.engine.compiled`):
            ``auto`` (default: on for CUDA; on CPU only predictive coding's whole-batch graph, for runs of at
            least 10,000 mini-batches, as compiling costs seconds and single steps gain nothing),
            ``on`` (CUDA graphs on CUDA), ``no-cudagraphs`` or ``off``. A speed setting, not one of the maths:
            a resumed run may change it.
        check_equilibrium: after every epoch, measure how far the rule's weight gradient is from the one at
            its inference's equilibrium (:func:`inferlearn.diagnostics.equilibrium_gap` on the first
            :data:`~inferlearn.training.loop.EQUILIBRIUM_SAMPLES` training images; ``equilibrium_gap`` in the
            metrics line) and warn once per run above 10 % (``--check-equilibrium``; PC, MAC, LPOM and lifted
            Fenchel, whose inference runs a fixed number of steps). Costs one solve of 3000 steps per epoch; a
            diagnostic, not a setting of the maths: a resumed run may change it.
        divergence_factor: stop when a mini-batch loss exceeds this multiple of the run's first
            mini-batch loss (a bounded-unit network can blow up its output weights to 1e16 without
            ever producing a NaN).
    """

    data: str = "digits"
    arch: str = "64-32-32-10"
    act: str = "relu"
    rule: str = "backprop"
    rule_options: dict = field(default_factory=dict)
    epochs: int = 10
    batch_size: int = 50
    optimizer: str = "sgd"
    lr: float | None = None
    momentum: float = 0.0
    weight_decay: float = 0.0
    lr_schedule: str = "constant"
    seed: int = 0
    init_scale: float = 1.0
    device: str = "cpu"
    dtype: str = "float32"
    out: str = "runs/train"
    data_dir: str | None = None
    allow_unverified: bool = False
    tensorboard: str | None = None
    threads: int = 1
    nproc: int = 1                 # data-parallel processes (recorded; resume may use another number)
    dist_timeout: float = 120.0    # seconds a rank waits for the others before failing
    limit_train: int | None = None
    val_size: int = 0
    checkpoint_every: int = 1
    divergence_factor: float = 1e6
    compile: str = "auto"
    standardize: str = "auto"
    augment: str = "none"
    check_equilibrium: bool = False

    def __post_init__(self) -> None:
        from ..rules import RULES

        check_name(self.data)
        check_arch(self.arch)
        check_schedule(self.lr_schedule, int(self.epochs) if isinstance(self.epochs, int) else None)
        try:
            get_units(self.act)
        except ValueError as exc:
            raise ValueError(f"{exc} for --act (the hidden units of MLP and conv strings); a zoo model takes any "
                             f"activation as an option, e.g. --arch {self.arch.partition(':')[0]}:act={self.act}") from None
        if self.rule not in RULES:
            raise ValueError(f"Unknown rule {self.rule!r}; choose one of {sorted(RULES)}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"Unknown optimizer {self.optimizer!r}; choose one of {list(OPTIMIZERS)}")
        if self.lr is not None and not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"Invalid learning rate: {self.lr}")
        if isinstance(self.weight_decay, bool) or not (isinstance(self.weight_decay, (int, float))
                                                        and math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"Invalid weight_decay: {self.weight_decay} (must be a number ≥ 0, e.g. --weight-decay 5e-4)")
        if self.standardize not in STANDARDIZE:
            raise ValueError(f"Unknown standardize mode {self.standardize!r}; choose one of {list(STANDARDIZE)}")
        if self.augment not in AUGMENT:
            raise ValueError(f"Unknown augment {self.augment!r}; choose one of {list(AUGMENT)}")
        if not (0 <= self.momentum < 1):
            raise ValueError(f"Invalid momentum: {self.momentum}")
        check_momentum(self.optimizer, self.momentum)
        if self.augment == "crop-flip" and self.data in MIRROR_SENSITIVE:
            raise ValueError(f"--augment crop-flip on {self.data} mirrors digits left-right (a mirrored digit is another "
                             f"digit or none: test accuracy 0.08 after one epoch on digits against 0.63 without): use "
                             f"--augment none, or --augment {FORCE_FLIP} to flip them anyway")
        for name in ("epochs", "batch_size", "checkpoint_every"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"Invalid {name}: {getattr(self, name)} (must be ≥ 1)")
        if not (self.divergence_factor > 1):
            raise ValueError(f"Invalid divergence_factor: {self.divergence_factor} (must be > 1)")
        if not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"Invalid seed: {self.seed} (must be an integer in 0 … {MAX_SEED})")
        if not isinstance(self.nproc, int) or self.nproc < 1:
            raise ValueError(f"Invalid nproc: {self.nproc} (must be an integer ≥ 1)")
        if not (isinstance(self.dist_timeout, (int, float)) and self.dist_timeout > 0):
            raise ValueError(f"Invalid dist_timeout: {self.dist_timeout} (must be > 0 seconds)")
        if self.limit_train is not None and self.limit_train < 1:
            raise ValueError(f"Invalid limit_train: {self.limit_train}")
        check_compile_mode(self.compile)
        if not isinstance(self.check_equilibrium, bool):
            raise ValueError(f"Invalid check_equilibrium: {self.check_equilibrium!r} (true or false)")
        if isinstance(self.val_size, bool) or not isinstance(self.val_size, int) or self.val_size < 0:
            raise ValueError(f"Invalid val_size: {self.val_size} (must be an integer ≥ 0)")
        if self.dtype not in DTYPES:
            raise ValueError(f"Unknown dtype {self.dtype!r}; choose one of {list(DTYPES)}")
        if isinstance(self.out, str) and not self.out.strip():
            raise ValueError(f"Invalid --out {self.out!r}: give a folder name, e.g. --out runs/train")
        if not self.device.startswith(("cpu", "cuda", "mps")):
            raise ValueError(f"Unknown device {self.device!r}; use cpu or cuda")

    def resolved(self) -> "TrainConfig":
        """This config with ``lr=None`` replaced by the rule's recommended rate for the optimiser (Adam's for
        ``adamw``; for incremental predictive coding with SGD, its ``weight_step``: the rate at which one step on its
        gradient is iPC's) and ``standardize="auto"`` by ``on`` or ``off`` for the data set."""
        from ..rules import make_rule, recommended_lr

        lr = self.lr
        if lr is None:
            step = getattr(make_rule(self.rule, self.rule_options), "weight_step", None) if self.rule == "pc" else None
            if step is not None and self.optimizer == "sgd":
                lr = float(step)
            else:
                lr = recommended_lr(self.rule, "adam" if self.optimizer == "adamw" else self.optimizer)
        return self.replace(lr=lr, standardize=resolve_standardize(self.standardize, check_name(self.data)))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """Build from a dict; an unknown key, or a value of the wrong type, raises ``ValueError`` naming the key (a typo
        must not be ignored). A key of
        :data:`LEGACY` that the dict lacks (a ``config.json`` older than the setting) takes its old value."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"Unknown config keys {sorted(unknown)}; known keys: {sorted(known)}")
        for f in dataclasses.fields(cls):
            if f.name in d and not fits(d[f.name], f.type):
                default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
                raise ValueError(f"key {f.name!r} is {json_kind(d[f.name])} ({d[f.name]!r}), not {expect(f.type)} "
                                 f"(the default is {json.dumps(default)})")
        return cls(**(LEGACY | d))

    def replace(self, **changes) -> "TrainConfig":
        return dataclasses.replace(self, **changes)

