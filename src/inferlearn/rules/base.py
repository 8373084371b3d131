"""The learning-rule contract: a rule fills ``p.grad`` of a model and never steps.

Any ``torch.optim`` optimiser then applies the update, so schedulers, clipping and distributed
all-reduce work unchanged, and back-propagation is just one more rule::

    for x, labels in loader:
        opt.zero_grad()
        info = rule.backward(model, x, labels)
        opt.step()

Contract (checked for every registered rule on a model zoo by ``tests/rules/test_rule_contract.py``):

* after ``backward`` every trainable parameter has a finite ``.grad``;
* parameter values are unchanged;
* gradients *accumulate* into ``.grad`` (two calls give twice the gradient), like autograd;
* the same inputs give the same gradients (determinism);
* a rule keeps no state between calls: its fields are its hyper-parameters, diagnostics travel in
  :attr:`StepInfo.extras`, and learning-rate schedules belong to ``torch.optim.lr_scheduler``.

One extension, for methods whose variables live per training sample (MAC's auxiliary coordinates,
which persist across epochs): a :class:`PerSampleRule` receives each batch's
positions in the training set (``backward(model, x, labels, index=…)``), is told when an epoch starts
(:meth:`Rule.begin_epoch`), and keeps that per-sample state in :meth:`Rule.state_dict`, which the
training loop saves in every checkpoint and restores on ``--resume`` (so a resumed run stays exact).
Called without ``index`` such a rule is stateless like every other::

    for epoch in range(1, epochs + 1):
        rule.begin_epoch(epoch, n_train)
        for index in batches:                      # positions in the training set
            opt.zero_grad()
            rule.backward(model, x[index], labels[index], index=index)
            opt.step()

Gradients are of batch-mean objectives, so learning rates do not depend on the batch size.
"""
from __future__ import annotations

import abc
import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from ..engine.compiled import compiling
from .batch_layers import batch_layers
from ..losses import check_labels
from ..tensors import accumulate_grad, all_finite, has_only_finite  # noqa: F401  (accumulate_grad: public here)


@dataclass
class StepInfo:
    """What a rule reports for one mini-batch.

    Attributes:
        loss: the quadratic (or configured) loss of the forward pass on this batch (batch mean),
            the same quantity for every rule so that runs compare.
        output: the forward-pass output (batch, n_out), detached, for accuracy.
        extras: rule-specific scalars (energies, solver iterations, residuals).
    """

    loss: float
    output: torch.Tensor
    extras: dict = dataclasses.field(default_factory=dict)


class Rule(abc.ABC):
    """Abstract learning rule. Subclasses are dataclasses of hyper-parameters plus :meth:`_backward`.

    Class attributes:
        name: the registry / CLI name.
        recommended_lr: the learning rate per optimiser (``sgd``, ``adam``) that suits the rule at its
            default options; :class:`~inferlearn.training.TrainConfig` and the commands use it when no
            ``lr`` is given. The registered rules carry the values chosen on validation splits by
            ``benchmarks/tune_defaults.py``; a new rule inherits ``{"sgd": 0.05, "adam": 0.001}``.
    """

    name: ClassVar[str] = ""
    recommended_lr: ClassVar[dict] = {"sgd": 0.05, "adam": 0.001}
    #: whether the rule reads BatchNorm in training mode and dropout (:mod:`inferlearn.rules.batch_layers`)
    reads_batch_layers: ClassVar[bool] = False

    def backward(self, model: nn.Module, x: torch.Tensor, labels: torch.Tensor,
                 index: torch.Tensor | None = None, *, validated: bool = False, compile: str | None = None) -> StepInfo:
        """Validate the batch, then accumulate the rule's gradient into ``.grad`` of ``model``.

        Args:
            index: optional positions of the batch's samples in the training set (1-D integers, one
                per input, distinct); only a :class:`PerSampleRule` reads them.
            validated: the caller has checked the batch already (finite floating-point inputs the model
                takes, labels in range, no non-finite ``.grad`` held, a valid ``index``), as the training loop
                does once for the whole data set: the per-batch checks are skipped (on a small MLP they cost
                about a fifth of a back-propagation step).
            compile: the compile mode of this call's steps (:data:`~inferlearn.engine.compiled.COMPILE_MODES`:
                ``"auto"``, ``"on"``, ``"no-cudagraphs"``, ``"off"``; :mod:`inferlearn.engine.compiled`); ``None``
                keeps the mode of the enclosing :func:`~inferlearn.engine.compiled.compiling` block (default ``"off"``).

        Raises:
            ValueError: an empty batch, non-finite inputs, labels that are not 1-D integers, one per
                input, within the model's outputs, a bad ``index`` (the message says which).
        """
        if compile is not None:
            with compiling(compile):
                return self.backward(model, x, labels, index, validated=validated)
        if validated:
            return self._run(model, x, labels, index)
        if not torch.is_tensor(x) or x.dim() < 2 or x.shape[0] == 0:
            raise ValueError(f"Expected a non-empty batch of inputs (batch, features...), got "
                             f"{tuple(x.shape) if torch.is_tensor(x) else type(x).__name__}")
        if not x.is_floating_point():
            raise ValueError(f"Expected floating-point inputs, got {x.dtype}; convert them, e.g. x.float()")
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError(f"{type(model).__name__} has no trainable parameters (none, or all with "
                             "requires_grad=False): there is nothing for the rule to learn")
        held = [p.grad for p in params if p.grad is not None]   # gradients accumulate into .grad
        if held and not all_finite(held):
            raise ValueError(".grad of the model's parameters already holds NaN or inf before the rule ran; call "
                             "optimizer.zero_grad() before rule.backward")
        if hasattr(model, "check_input"):
            model.check_input(x)
        elif not has_only_finite(x):
            raise ValueError("Input contains NaN or inf values")
        check_labels(labels, getattr(model, "out_features", None), batch=x.shape[0])
        if index is not None and isinstance(self, PerSampleRule):
            index = check_index(index, x.shape[0])
        return self._run(model, x, labels, index)

    def _run(self, model: nn.Module, x: torch.Tensor, labels: torch.Tensor, index: torch.Tensor | None) -> StepInfo:
        """:meth:`_backward` on a checked batch (with the sample index for a :class:`PerSampleRule`), within
        :func:`~inferlearn.rules.batch_layers.batch_layers` for a rule that reads BatchNorm in training mode and
        dropout."""
        if self.reads_batch_layers and model.training:
            with batch_layers(model, x):
                return self._run_plain(model, x, labels, index)
        return self._run_plain(model, x, labels, index)

    def _run_plain(self, model: nn.Module, x: torch.Tensor, labels: torch.Tensor, index) -> StepInfo:
        if index is not None and isinstance(self, PerSampleRule):
            return self._backward(model, x, labels, index=index)
        return self._backward(model, x, labels)

    def __setattr__(self, name: str, value) -> None:
        """A registered rule's options are sealed once it is built: its solvers, checks and caches were derived from
        them, so a later ``rule.tol = 1e-8`` would be silently ignored; it raises instead
        (:class:`dataclasses.FrozenInstanceError`). ``dataclasses.replace(rule, tol=1e-8)`` builds the changed rule.
        Private state (per-sample coordinates, the epoch's μ or β, warned-once flags) stays mutable."""
        if self.__dict__.get("_sealed") and name in getattr(type(self), "__dataclass_fields__", {}):
            raise dataclasses.FrozenInstanceError(
                f"cannot set {type(self).__name__}.{name}: a rule's options are fixed when it is built (its solver "
                f"was made from them); use dataclasses.replace(rule, {name}={value!r})")
        object.__setattr__(self, name, value)

    def equilibrium_options(self) -> dict | None:
        """The options that run this rule's inference to the equilibrium its gradient stands for (``None``: the
        gradient is already its own, e.g. back-propagation's, or a phase solved to a tolerance).

        :func:`inferlearn.diagnostics.equilibrium_gap` compares the gradient at the rule's settings with the one
        of ``dataclasses.replace(rule, **equilibrium_options())``.
        """
        return None

    def begin_epoch(self, epoch: int, n_samples: int) -> None:
        """Called by the training loop before epoch ``epoch`` (1-based) over ``n_samples`` training
        samples; a no-op for rules without per-sample state."""

    def state_dict(self) -> dict:
        """The rule's per-sample state, saved in checkpoints (empty for stateless rules)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (``--resume``)."""

    @abc.abstractmethod
    def _backward(self, model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> StepInfo:
        """Compute and accumulate gradients for a validated batch."""


def check_index(index, batch: int) -> torch.Tensor:
    """Validate sample indices: a 1-D tensor of ``batch`` distinct non-negative integers."""
    ok = (torch.is_tensor(index) and index.dim() == 1 and index.shape[0] == batch
          and not index.is_floating_point() and index.dtype != torch.bool)
    if not ok:
        raise ValueError(f"Invalid index: expected a 1-D integer tensor of {batch} sample positions, got "
                         f"{tuple(index.shape) if torch.is_tensor(index) else type(index).__name__}")
    if bool((index < 0).any()) or index.unique().numel() != batch:
        raise ValueError("Invalid index: sample positions must be distinct and non-negative")
    return index


RULES: dict[str, type[Rule]] = {}


def register_rule(cls: type[Rule]) -> type[Rule]:
    """Class decorator adding a rule to :data:`RULES` under ``cls.name``."""
    if not cls.name:
        raise TypeError(f"{cls.__name__} has no name")
    if cls.name in RULES and RULES[cls.name] is not cls:
        raise TypeError(f"Rule name {cls.name!r} already used by {RULES[cls.name].__name__}")
    RULES[cls.name] = cls
    build = cls.__init__
    if not getattr(build, "_seals", False):
        def __init__(self, *args, **kwargs):
            build(self, *args, **kwargs)
            object.__setattr__(self, "_sealed", True)   # after the most derived __post_init__

        __init__._seals = True
        __init__.__doc__, __init__.__wrapped__ = build.__doc__, build
        cls.__init__ = __init__
    return cls


class PerSampleRule(Rule):
    """A rule whose variables live per training sample and persist across epochs (MAC's auxiliary coordinates): the
    one extension of the contract, as an explicit base. The training loop passes each batch's positions in the
    training set (``backward(..., index=…)``), saves :meth:`state_dict` in every checkpoint, and in a data-parallel
    run gathers the rows of :meth:`sample_state` after every step (:meth:`inferlearn.distributed.Group.
    share_sample_state`), so that every process holds every sample's state. Called without ``index``, such a rule is
    stateless like every other."""

    @abc.abstractmethod
    def sample_state(self, index: torch.Tensor) -> torch.Tensor | None:
        """The per-sample state of the samples ``index`` as rows ``(len(index), D)`` (``None``: none yet)."""

    @abc.abstractmethod
    def set_sample_state(self, index: torch.Tensor, rows: torch.Tensor) -> None:
        """Store rows made by :meth:`sample_state` (of any process) for the samples ``index``."""


def recommended_lr(rule: str, optimizer: str) -> float:
    """The learning rate a registered rule recommends for ``optimizer`` (:attr:`Rule.recommended_lr`).

    Raises:
        ValueError: an unknown rule, or an optimiser the rule names no rate for.
    """
    if rule not in RULES:
        raise ValueError(f"Unknown rule {rule!r}; choose one of {sorted(RULES)}")
    rates = RULES[rule].recommended_lr
    if optimizer not in rates:
        raise ValueError(f"Rule {rule!r} recommends no learning rate for optimizer {optimizer!r} (it has "
                         f"{sorted(rates)}); give --lr")
    return float(rates[optimizer])


def _convert(value: str, typ, key: str, rule: str):
    origin = typing.get_origin(typ)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if value.lower() == "none" and len(args) < len(typing.get_args(typ)):
            return None
        typ = args[0]
    try:
        if typ is bool:
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if typ is float:
            if "/" in value:   # a fraction such as 1/8 (no eval of user strings)
                num, den = value.split("/", 1)
                return float(num) / float(den)
            return float(value)
        return typ(value)
    except (ValueError, TypeError, SyntaxError, ZeroDivisionError):
        raise ValueError(f"Invalid value {value!r} for option {key!r} of rule {rule!r} (expected {typ.__name__})") from None


def make_rule(name: str, options: dict | None = None) -> Rule:
    """Build a registered rule from its name and options.

    Options may be strings (from the command line, ``--rule-opt gamma=1/8``); they are converted to
    the field's type. Unknown names and keys raise ``ValueError`` listing what is available.

    Example:
        >>> import torch
        >>> from inferlearn.models import MLP
        >>> rule = make_rule("pc", {"steps": "20"})          # a string option, converted to the field's int
        >>> rule.steps
        20
        >>> model = MLP("4-8-3", "relu")
        >>> info = rule.backward(model, torch.rand(5, 4), torch.tensor([0, 1, 2, 0, 1]))
        >>> all(p.grad is not None for p in model.parameters())
        True
        >>> make_rule("pcx")
        Traceback (most recent call last):
        ...
        ValueError: Unknown rule 'pcx'; choose one of [...]
    """
    if name not in RULES:
        raise ValueError(f"Unknown rule {name!r}; choose one of {sorted(RULES)}")
    cls = RULES[name]
    options = dict(options or {})
    fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    hints = typing.get_type_hints(cls) if fields else {}
    kwargs = {}
    for key, value in options.items():
        if key not in fields:
            raise ValueError(f"Unknown option {key!r} for rule {name!r}; known options: {sorted(fields) or 'none'}")
        kwargs[key] = _convert(value, hints[key], key, name) if isinstance(value, str) else value
    return cls(**kwargs)


def rule_options(rule: Rule) -> dict:
    """The hyper-parameters of a rule instance, JSON-serialisable (for ``config.json``)."""
    if not dataclasses.is_dataclass(rule):
        return {}
    out = {}
    for f in dataclasses.fields(rule):
        v = getattr(rule, f.name)
        out[f.name] = v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
    return out


def check_positive(name: str, value: float, allow_zero: bool = False) -> None:
    """Raise ``ValueError(f"Invalid {name}: {value}")`` unless ``value`` is finite and > 0 (or ≥ 0)."""
    ok = isinstance(value, (int, float)) and math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise ValueError(f"Invalid {name}: {value}")
