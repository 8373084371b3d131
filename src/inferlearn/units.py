"""Unit sets of lifted networks: the convex sets ``C_k`` whose projection is the activation.

Each hidden unit type is a box ``[lower, upper]`` (possibly unbounded), and the activation is the
projection ``Π_C(a) = clamp(a, lower, upper)`` -- the proximal map of the indicator ``ι_C``.

==============  =============  =================
name            set C          activation
==============  =============  =================
``linear``      ℝ              identity
``relu``        ℝ≥0            max(0, a)
``hard-sigmoid`` [0, 1]         clamp(a, 0, 1)
``hard-tanh``   [-1, 1]        clamp(a, -1, 1)
==============  =============  =================

References:
    Zach & Estellers, "Contrastive learning for lifted networks", Sec. 3, Eq. 1 (MATH.md §A).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class UnitSet:
    """A box ``C = [lower, upper]`` per coordinate; ``±inf`` means unbounded.

    Attributes:
        name: the CLI name (``relu``, ``hard-sigmoid``, ...).
        lower: lower bound of every coordinate.
        upper: upper bound of every coordinate.
    """

    name: str
    lower: float
    upper: float

    def __post_init__(self) -> None:
        if not self.lower < self.upper:
            raise ValueError(f"Invalid unit set {self.name!r}: lower {self.lower} must be < upper {self.upper}")

    @property
    def is_linear(self) -> bool:
        """True when the set is all of ℝ (no constraint, identity activation)."""
        return math.isinf(self.lower) and math.isinf(self.upper)

    def project(self, a: torch.Tensor) -> torch.Tensor:
        """``Π_C(a)``: the activation applied to pre-activations ``a``."""
        if self.is_linear:
            return a
        lo = None if math.isinf(self.lower) else self.lower
        hi = None if math.isinf(self.upper) else self.upper
        return a.clamp(min=lo, max=hi)

    def engaged(self, a: torch.Tensor) -> torch.Tensor:
        """Boolean mask where the projection changes ``a`` (the non-linearity is active)."""
        if math.isinf(self.upper):
            return a < self.lower
        if math.isinf(self.lower):
            return a > self.upper
        return (a < self.lower) | (a > self.upper)

    def normal_cone_violation(self, z: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """Residual of ``0 ∈ g + N_C(z)`` per coordinate: ``z - Π_C(z - g)``.

        It is zero exactly at a minimiser of a convex function with gradient ``g`` over ``C``
        (the projected-gradient fixed point), and is used as the optimality residual of solvers.
        """
        return z - self.project(z - g)


LINEAR = UnitSet("linear", -math.inf, math.inf)
RELU = UnitSet("relu", 0.0, math.inf)
HARD_SIGMOID = UnitSet("hard-sigmoid", 0.0, 1.0)
HARD_TANH = UnitSet("hard-tanh", -1.0, 1.0)

UNIT_SETS = {u.name: u for u in (LINEAR, RELU, HARD_SIGMOID, HARD_TANH)}


# other spellings of the same units (one vocabulary on every command)
ALIASES = {"hardsigmoid": "hard-sigmoid", "hardtanh": "hard-tanh", "identity": "linear", "none": "linear"}


def get_units(name: str | UnitSet) -> UnitSet:
    """Look up a unit set by name (``relu``, ``hard-sigmoid`` or ``hardsigmoid``, ...).

    Raises ``ValueError`` listing the known names.
    """
    if isinstance(name, UnitSet):
        return name
    key = str(name).lower().replace("_", "-")
    key = ALIASES.get(key, key)
    if key not in UNIT_SETS:
        raise ValueError(f"Unknown unit type {name!r}; choose one of {sorted(UNIT_SETS)}")
    return UNIT_SETS[key]


def box(lower: float, upper: float) -> UnitSet:
    """The unit set ``[lower, upper]``, named after the known set it equals (else ``box[lo,hi]``)."""
    for u in UNIT_SETS.values():
        if u.lower == lower and u.upper == upper:
            return u
    return UnitSet(f"box[{lower:g},{upper:g}]", float(lower), float(upper))


class Clamp(nn.Module):
    """The activation ``Π_C(a) = clamp(a, lower, upper)`` of a unit set, as a module.

    Put it in your own ``nn.Sequential`` to use a unit type that PyTorch has no module for (e.g.
    ``Clamp("hard-sigmoid")``, the clamp to ``[0, 1]``); ``nn.ReLU``, ``nn.ReLU6``, ``nn.Hardtanh`` and
    ``nn.Identity`` are recognised as unit sets too (:func:`units_of_module`).

    Args:
        units: a unit-set name or :class:`UnitSet`.
    """

    def __init__(self, units: str | UnitSet = "hard-sigmoid"):
        super().__init__()
        self.units = get_units(units)

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return self.units.project(a)

    def extra_repr(self) -> str:
        return self.units.name


def units_of_module(module: nn.Module) -> UnitSet | None:
    """The unit set whose projection ``module`` computes, or ``None`` if it is not a box projection.

    ``nn.ReLU`` → ``relu``; ``nn.ReLU6`` → ``[0, 6]``; ``nn.Hardtanh(lo, hi)`` → ``[lo, hi]`` (so
    ``nn.Hardtanh(0, 1)`` is ``hard-sigmoid``); ``nn.Identity`` → ``linear``; :class:`Clamp` → its set.
    ``nn.Hardsigmoid`` is *not* a box projection (it is ``clamp(a/6 + 1/2, 0, 1)``).
    """
    if isinstance(module, Clamp):
        return module.units
    if isinstance(module, nn.ReLU6):
        return box(0.0, 6.0)
    if isinstance(module, nn.ReLU):
        return RELU
    if isinstance(module, nn.Hardtanh):   # ReLU6 is a Hardtanh subclass: checked above
        return box(float(module.min_val), float(module.max_val))
    if isinstance(module, nn.Identity):
        return LINEAR
    return None
