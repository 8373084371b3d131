"""Typed, validated training configuration (one frozen dataclass, JSON round-trip, loud on unknown keys)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from ..engine.compiled import check_compile_mode
from ..units import get_units
from ..data.datasets import check_name
from ..models import check_arch
from .schedules import check_schedule

OPTIMIZERS = ("sgd", "adam")
DTYPES = ("float32", "float64")
#: the largest seed: each epoch's batch order is seeded with ``seed · 100003 + epoch``, which torch's
#: generators take up to 2**64 - 1
MAX_SEED = 2 ** 47 - 1


@dataclass(frozen=True)
class TrainConfig:
    """Everything needed to rerun a training run (written to ``config.json``).

    Attributes:
        data: data set name (``digits``, ``mnist``, ``fashion-mnist``, ``cifar10``, ``cifar10-gray``).
        arch: ``784-64-64-64-10`` (an MLP; the first and last widths must match the data),
            ``conv:16-32/64`` (a conv net), a zoo model (``vgg5``, ``resnet20:width=0.5``,
            ``resmlp:depth=64,param=mupc``, ...) or ``package.module:function`` (your own model); see
            :func:`inferlearn.models.build_model`.
        act: hidden unit type (``relu``, ``hard-sigmoid``, ``hard-tanh``, ``linear``).
        rule: learning rule name (see ``inferlearn.rules.RULES``).
        rule_options: the rule's hyper-parameters, as strings or values.
        epochs, batch_size: training length and mini-batch size.
        optimizer, lr, momentum: ``sgd`` or ``adam``; learning rate; SGD momentum. ``lr=None`` (the default)
            takes the rule's recommended rate for the optimiser (:attr:`inferlearn.rules.Rule.recommended_lr`,
            chosen on validation splits by ``benchmarks/tune_defaults.py``); a run resolves it when it
            starts (:meth:`resolved`), so ``config.json`` records the number it trained with.
        lr_schedule: ``constant``, ``warmup`` or ``scaled:F`` (:mod:`inferlearn.training.schedules`).
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
            ``auto`` (default: on for CUDA, off on CPU, where compiling costs seconds and gains little),
            ``on`` (CUDA graphs on CUDA), ``no-cudagraphs`` or ``off``. A speed setting, not one of the maths:
            a resumed run may change it.
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

    def __post_init__(self) -> None:
        from ..rules import RULES

        check_name(self.data)
        check_arch(self.arch)
        check_schedule(self.lr_schedule)
        get_units(self.act)
        if self.rule not in RULES:
            raise ValueError(f"Unknown rule {self.rule!r}; choose one of {sorted(RULES)}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"Unknown optimizer {self.optimizer!r}; choose one of {list(OPTIMIZERS)}")
        if self.lr is not None and not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"Invalid learning rate: {self.lr}")
        if not (0 <= self.momentum < 1):
            raise ValueError(f"Invalid momentum: {self.momentum}")
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
        if isinstance(self.val_size, bool) or not isinstance(self.val_size, int) or self.val_size < 0:
            raise ValueError(f"Invalid val_size: {self.val_size} (must be an integer ≥ 0)")
        if self.dtype not in DTYPES:
            raise ValueError(f"Unknown dtype {self.dtype!r}; choose one of {list(DTYPES)}")
        if isinstance(self.out, str) and not self.out.strip():
            raise ValueError(f"Invalid --out {self.out!r}: give a folder name, e.g. --out runs/train")
        if not self.device.startswith(("cpu", "cuda", "mps")):
            raise ValueError(f"Unknown device {self.device!r}; use cpu or cuda")

    def resolved(self) -> "TrainConfig":
        """This config with ``lr=None`` replaced by the rule's recommended rate for the optimiser (for incremental
        predictive coding with SGD, its ``weight_step``: the rate at which one step on its gradient is iPC's)."""
        from ..rules import make_rule, recommended_lr

        if self.lr is not None:
            return self
        step = getattr(make_rule(self.rule, self.rule_options), "weight_step", None) if self.rule == "pc" else None
        if step is not None and self.optimizer == "sgd":
            return self.replace(lr=float(step))
        return self.replace(lr=recommended_lr(self.rule, self.optimizer))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """Build from a dict; an unknown key raises ``ValueError`` (a typo must not be ignored)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"Unknown config keys {sorted(unknown)}; known keys: {sorted(known)}")
        return cls(**d)

    def replace(self, **changes) -> "TrainConfig":
        return dataclasses.replace(self, **changes)
