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


def get_units(name: str | UnitSet) -> UnitSet:
    """Look up a unit set by name; raises ``ValueError`` listing the known names."""
    if isinstance(name, UnitSet):
        return name
    key = str(name).lower().replace("_", "-")
    if key not in UNIT_SETS:
        raise ValueError(f"Unknown unit type {name!r}; choose one of {sorted(UNIT_SETS)}")
    return UNIT_SETS[key]
