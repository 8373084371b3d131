"""Benchmark protocols: named tables of data set × model × rule variants, with search spaces and budgets.

A :class:`Protocol` fixes what the field's benchmark (PCX, Pinchetti et al. 2024) fixes: the data set, the
model (an ``--arch`` string), the training settings every run shares (``train``: a plain dict of
:class:`~inferlearn.training.config.TrainConfig` field overrides — optimiser, batch size, epochs, schedule,
units), the size of the validation split the search selects on, and a list of :class:`Variant` s: a rule,
its options, its own overrides and its *search space* (a grid over the learning rate, rule options such
as PC's inference rate ``η``, or any other TrainConfig field). :mod:`inferlearn.benchmark.runner` runs it.

Every override is checked against the fields of ``TrainConfig`` when the protocol is built, so a field
this version does not have (``weight_decay``, ``augment``, …) fails loudly, naming it, instead of being
dropped: a protocol that needs such a field can be written as soon as the field exists.

The built-in protocols (:mod:`~inferlearn.benchmark.catalogue`, ``inferlearn benchmark --list``):

| name           | data                 | model                    | full budget                    |
|----------------|----------------------|--------------------------|--------------------------------|
| `mlp-mnist`    | MNIST                | PCX's MLP (`pcx-mlp`)     | 10 epochs, any CPU             |
| `mlp-fashion`  | Fashion-MNIST        | PCX's MLP (`pcx-mlp`)     | 10 epochs, any CPU             |
| `vgg5-cifar10` | CIFAR-10 (colour)    | PCX's VGG-5 (`vgg5`)      | 50 epochs at full width, CUDA  |

PCX's published numbers (:class:`Reference`) are kept beside the protocol they belong to and printed
beside ours; they come from the paper named in ``source``, and none is invented for a setting the paper
does not report.

References:
    Pinchetti, Qi, Lokshyn, Olivers, Emde, Tang, M'Charrak, Frieder, Menzat, Bogacz, Lukasiewicz, Salvatori,
    *Benchmarking predictive coding networks -- made simple* (2024, arXiv:2407.01163).
"""
from __future__ import annotations

import dataclasses
import inspect
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..training.config import TrainConfig

#: TrainConfig fields a protocol may not set: the benchmark sets them per run (seed, split, folder, device); a
#: variant may set ``arch`` (e.g. a model its rule can read), which the budget scales like the protocol's
RESERVED = ("data", "rule", "rule_options", "seed", "val_size", "out", "device", "data_dir",
            "allow_unverified", "threads", "tensorboard", "nproc")
#: how a search selects its hyper-parameters: the validation accuracy of the last epoch, or of the best one
SELECTIONS = ("last", "best")
PCX = ("Pinchetti et al., Benchmarking predictive coding networks -- made simple (2024, arXiv:2407.01163), "
       "VGG-5 on CIFAR-10, 50 epochs")


def _config_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(TrainConfig)}


def check_overrides(overrides: Mapping, where: str) -> None:
    """Raise ``ValueError`` naming ``where`` when ``overrides`` sets a field TrainConfig does not have (or one the
    benchmark sets itself)."""
    known = _config_fields()
    for key in overrides:
        if key not in known:
            raise ValueError(f"{where}: unknown TrainConfig field {key!r} (this version of inferlearn has no such "
                             f"setting; known: {', '.join(sorted(known - set(RESERVED)))})")
        if key in RESERVED:
            raise ValueError(f"{where}: {key!r} is set by the benchmark itself, not by a protocol")


@dataclass(frozen=True)
class Variant:
    """One row of a protocol: a rule with its options, its own settings and its search space.

    Attributes:
        name: the row's short name (``bp``, ``pc-ce``, …; also its folder name).
        rule: the rule's registry name (``inferlearn.rules.RULES``).
        label: what the table calls it (e.g. ``PC, cross-entropy``).
        options: the rule's options (``{"output": "ce"}``).
        train: TrainConfig overrides of this variant (on top of the protocol's).
        search: the grid searched on the validation split: ``{"lr": (1e-4, 3e-4), "rule.step_size": (0.05, 0.1)}``;
            ``lr`` and other keys are TrainConfig fields, ``rule.KEY`` a rule option. The full product is
            searched; a grid of one point (or none) is not searched.
        max_seeds: at most this many final runs (seeds 0 … max_seeds − 1) whatever ``--seeds`` asks, for a row
            whose one run costs hours at a budget; the table shows each row's seed count. ``None``: ``--seeds``.
    """

    name: str
    rule: str
    label: str = ""
    options: Mapping = field(default_factory=dict)
    train: Mapping = field(default_factory=dict)
    search: Mapping = field(default_factory=dict)
    max_seeds: int | None = None

    def __post_init__(self) -> None:
        from ..rules import RULES, make_rule

        if self.max_seeds is not None and (isinstance(self.max_seeds, bool) or not isinstance(self.max_seeds, int)
                                           or self.max_seeds < 1):
            raise ValueError(f"Variant {self.name}: invalid max_seeds {self.max_seeds!r} (a positive integer, or null)")

        if not self.name or not all(c.isalnum() or c in "-_." for c in self.name):
            raise ValueError(f"Invalid variant name {self.name!r}: letters, digits, '-', '_' and '.' only")
        if self.rule not in RULES:
            raise ValueError(f"Variant {self.name}: unknown rule {self.rule!r}; choose one of {sorted(RULES)}")
        make_rule(self.rule, dict(self.options))
        check_overrides(self.train, f"Variant {self.name}")
        for key, values in self.search.items():
            if not isinstance(values, (list, tuple)) or not values:
                raise ValueError(f"Variant {self.name}: search {key!r} needs a non-empty list of values")
            if key.startswith("rule."):
                for v in values:   # every value must be an option the rule accepts
                    make_rule(self.rule, {**self.options, key[5:]: v})
            else:
                check_overrides({key: None}, f"Variant {self.name}, search")

    def final_seeds(self, seeds: int) -> int:
        """The final runs of this row when ``seeds`` are asked for: ``min(seeds, max_seeds)``."""
        return seeds if self.max_seeds is None else min(seeds, self.max_seeds)

    def grid(self) -> list[dict]:
        """Every point of the search space, in the order of the keys and values given."""
        keys = list(self.search)
        return [dict(zip(keys, values)) for values in itertools.product(*(self.search[k] for k in keys))]


@dataclass(frozen=True)
class Budget:
    """How far a protocol is scaled down: ``width`` multiplies the model's width, ``epochs`` its epochs."""

    name: str
    width: float = 1.0
    epochs: float = 1.0

    def __post_init__(self) -> None:
        for key in ("width", "epochs"):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and 0 < v <= 1 and math.isfinite(v)):
                raise ValueError(f"Invalid budget {key} ×{v}: must lie in (0, 1]")

    @property
    def factors(self) -> str:
        """``width ×0.125, epochs ×0.1``, or ``the protocol's own width and epochs``."""
        if self.width == 1 and self.epochs == 1:
            return "the protocol's own width and epochs"
        return f"width ×{self.width:g}, epochs ×{self.epochs:g}"

    @property
    def label(self) -> str:
        """``cpu (width ×0.125, epochs ×0.1)``: the name and the factors."""
        return f"{self.name} ({self.factors})"


FULL = Budget("full")


@dataclass(frozen=True)
class Reference:
    """A published number kept beside a protocol: ``test_acc`` (percent) of ``variant`` in ``source``."""

    variant: str
    test_acc: float
    note: str = ""


@dataclass(frozen=True)
class Protocol:
    """A benchmark: data set × model × rule variants, the shared settings, the search and the budgets.

    Attributes:
        name: registry name (``inferlearn benchmark NAME``).
        summary: one line.
        data: the data set (``TrainConfig.data``).
        arch: the model at the full budget (``TrainConfig.arch``; its width is scaled by a budget).
        variants: the rows; the one named ``baseline`` (back-propagation) is the reference of the time ratios.
        train: TrainConfig overrides shared by every run (epochs at the full budget, batch size, optimiser, …).
        val_size: the validation split of the search: the last N training images (``TrainConfig.val_size``).
        select: ``last`` (validation accuracy after the last epoch, default) or ``best`` (the best epoch's).
        search_seeds: seeds per search point (the score is the mean validation accuracy over them).
        extend: when a search's choice lies on an end of a numeric grid axis, search up to this many more points
            beyond that end, one grid ratio apart, before the final runs (:func:`~inferlearn.benchmark.runner.
            edge_extension`; 0: the grid only; the built-in protocols extend twice).
        cpu: the ``--budget cpu`` preset.
        smoke: the ``--budget smoke`` preset, a quick check that every row runs (default: ``cpu``'s factors).
        full_device: ``cuda`` when the full budget needs a GPU (refused without one), else ``cpu``.
        baseline: the variant the epoch times are divided by.
        references: published numbers, printed beside ours.
        source: where the references come from.
        notes: what differs from the reference protocol, printed under the table.
    """

    name: str
    summary: str
    data: str
    arch: str
    variants: tuple
    train: Mapping = field(default_factory=dict)
    val_size: int = 5000
    select: str = "last"
    search_seeds: int = 1
    extend: int = 0
    cpu: Budget = FULL
    smoke: Budget | None = None
    full_device: str = "cpu"
    baseline: str = "bp"
    references: tuple = ()
    source: str = ""
    notes: str = ""

    def __post_init__(self) -> None:
        check_overrides(self.train, f"Protocol {self.name}")
        names = [v.name for v in self.variants]
        if not names:
            raise ValueError(f"Protocol {self.name} has no variants")
        if len(set(names)) != len(names):
            raise ValueError(f"Protocol {self.name}: variant names repeat ({', '.join(names)})")
        if self.baseline not in names:
            raise ValueError(f"Protocol {self.name}: the baseline {self.baseline!r} is not one of its variants")
        if self.select not in SELECTIONS:
            raise ValueError(f"Protocol {self.name}: select {self.select!r}; choose one of {list(SELECTIONS)}")
        if not (isinstance(self.extend, int) and not isinstance(self.extend, bool) and self.extend >= 0):
            raise ValueError(f"Protocol {self.name}: extend must be an integer ≥ 0 (points searched beyond a grid's edge)")
        if not (isinstance(self.search_seeds, int) and self.search_seeds >= 1):
            raise ValueError(f"Protocol {self.name}: search_seeds must be an integer ≥ 1")
        if not (isinstance(self.val_size, int) and self.val_size >= 1):
            raise ValueError(f"Protocol {self.name}: val_size must be an integer ≥ 1 (the search needs a validation split)")
        if self.full_device not in ("cpu", "cuda"):
            raise ValueError(f"Protocol {self.name}: full_device must be cpu or cuda")
        for ref in self.references:
            if ref.variant not in names:
                raise ValueError(f"Protocol {self.name}: reference for unknown variant {ref.variant!r}")
        TrainConfig(data=self.data, arch=self.arch)   # the data set and the architecture are valid

    def variant(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)

    def reference(self, variant: str) -> Reference | None:
        return next((r for r in self.references if r.variant == variant), None)

    @classmethod
    def from_dict(cls, d: Mapping) -> "Protocol":
        """A protocol from plain data (a JSON file): the same keys, ``variants`` a list of dicts, ``cpu`` a dict
        ``{"width": F, "epochs": G}`` and ``references`` a list of ``{"variant", "test_acc", "note"}``."""
        d = dict(d)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"Unknown protocol keys {sorted(unknown)}; known keys: {sorted(known)}")
        for key in ("name", "summary", "data", "arch", "variants"):
            if key not in d:
                raise ValueError(f"The protocol lacks {key!r} (needs name, summary, data, arch, variants)")
        try:
            d["variants"] = tuple(Variant(**v) for v in d["variants"])
            for key in ("cpu", "smoke"):
                if d.get(key) is not None:
                    d[key] = Budget(key, **d[key])
            d["references"] = tuple(Reference(**r) for r in d.get("references", ()))
        except TypeError as exc:
            raise ValueError(f"Invalid protocol {d.get('name')!r}: {exc}") from None
        return cls(**d)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for key in ("cpu", "smoke"):
            b = getattr(self, key)
            d[key] = None if b is None else {"width": b.width, "epochs": b.epochs}
        return d

    @property
    def smoke_budget(self) -> Budget:
        """``--budget smoke``: the protocol's smoke preset, or the CPU preset's factors under that name."""
        return self.smoke or Budget("smoke", self.cpu.width, self.cpu.epochs)


def parse_budget(text: str, protocol: Protocol) -> Budget:
    """``full``, ``cpu`` (the protocol's CPU preset), ``smoke`` (its quick check) or a number ``F`` in (0, 1]
    (width and epochs × F).

    Raises:
        ValueError: anything else, in one line naming the value.
    """
    key = str(text).strip().lower()
    if key == "full":
        return FULL
    if key == "cpu":
        return protocol.cpu
    if key == "smoke":
        return protocol.smoke_budget
    try:
        f = float(key.split("/")[0]) / (float(key.split("/")[1]) if "/" in key else 1.0)
    except (ValueError, ZeroDivisionError, IndexError):
        f = math.nan
    if not (0 < f <= 1):
        raise ValueError(f"Invalid --budget {text!r}: give full, cpu, smoke or a number in (0, 1] that scales width and "
                         "epochs, e.g. --budget 0.25")
    return FULL if f == 1 else Budget(key, f, f)


def scaled_arch(arch: str, width: float) -> str:
    """``arch`` with its width multiplied by ``width``: a zoo model's ``width=`` option (a channel multiplier,
    or a hidden width rounded to an integer ≥ 1) or the hidden widths of an MLP string (``784-64-10``).

    Raises:
        ValueError: an architecture whose width cannot be scaled (a conv string, your own model).
    """
    if width == 1:
        return arch
    from ..models import ZOO

    name, _, opts = arch.partition(":")
    if name in ZOO and "width" in ZOO[name].options:
        parsed = ZOO[name].parse_options(opts)
        base = parsed.get("width", inspect.signature(ZOO[name].builder).parameters["width"].default)
        new = max(1, round(base * width)) if isinstance(base, int) else base * width
        items = [item for item in opts.split(",") if item.strip() and item.partition("=")[0].strip().lower() != "width"]
        return f"{name}:" + ",".join([f"width={new:g}" if isinstance(new, float) else f"width={new}"] + items)
    sizes = arch.split("-")
    if len(sizes) >= 2 and all(s.isdigit() for s in sizes):
        return "-".join([sizes[0]] + [str(max(1, round(int(s) * width))) for s in sizes[1:-1]] + [sizes[-1]])
    raise ValueError(f"Cannot scale the width of --arch {arch!r} for a budget below full: use a zoo model with a "
                     "width option or MLP widths, or --budget full")


def scaled_epochs(epochs: int, factor: float) -> int:
    """``round(epochs × factor)``, at least 1."""
    return max(1, round(epochs * factor))
