"""Phases of contrastive learning: free, clamped, and nudged by ``±β``, with their gradient weights.

Every contrastive method estimates a gradient as a weighted difference of the energy's parameter
gradient at two equilibria (docs/maths.md §B, Definition 1; the envelope theorem makes each term a partial
gradient at fixed ``z``)::

    clamped        ∇ = ∇E(ẑ_clamped) − ∇E(ž_free)                     (CHL, contrastive lifted J_1)
    positive       ∇ = [∇E(ẑ₊) − ∇E(z*)] / β,     ẑ₊ = argmin E + β ℓ̄    (a lower bound of ℓ̄)
    negative       ∇ = [∇E(z*) − ∇E(ẑ₋)] / β,     ẑ₋ = argmin E − β ℓ̄    (an upper bound)
    symmetric      ∇ = [∇E(ẑ₊) − ∇E(ẑ₋)] / (2β)                          (error O(β²))

:func:`nudged_phases` lists, for a nudging, the phases to solve as ``(sign of β, weight)`` pairs
(sign 0 is the free phase); equilibrium propagation and the argmin layer's contrastive backward
both read their phases from it.

References:
    Zach, "Bilevel programs meet deep learning", Definition 1, Prop. 1 and Eq. 37; Scellier & Bengio
    (2017); Laborieux et al. (2021), symmetric nudging; Movellan (1991), CHL.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

NUDGINGS = ("positive", "negative", "symmetric")


def check_beta(beta) -> float:
    """Validate a nudging strength: finite and strictly positive (``ValueError("Invalid beta: 0")``)."""
    ok = isinstance(beta, (int, float)) and not isinstance(beta, bool) and math.isfinite(beta) and beta > 0
    if not ok:
        raise ValueError(f"Invalid beta: {beta}")
    return float(beta)


def check_nudging(nudging: str) -> str:
    """Validate a nudging name (one of :data:`NUDGINGS`)."""
    if nudging not in NUDGINGS:
        raise ValueError(f"Invalid nudging: {nudging!r}; choose one of {list(NUDGINGS)}")
    return nudging


@dataclass(frozen=True)
class Phase:
    """One equilibrium of a contrastive estimate: nudged by ``sign · β`` (0 = free), weighted by ``weight / β``."""

    sign: int
    weight: float


def nudged_phases(nudging: str) -> tuple[Phase, Phase]:
    """The two phases of a nudging: the gradient is ``Σ weight · ∇E(ẑ_phase) / β``."""
    check_nudging(nudging)
    if nudging == "positive":
        return Phase(+1, 1.0), Phase(0, -1.0)
    if nudging == "negative":
        return Phase(0, 1.0), Phase(-1, -1.0)
    return Phase(+1, 0.5), Phase(-1, -0.5)
