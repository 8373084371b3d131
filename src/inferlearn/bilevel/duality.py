"""The contrastive surrogate as one joint minimisation: the min–min–min form through duality.

The contrastive surrogate (Definition 1; docs/maths.md §B) is a "min–min–max" problem: θ is minimised,
the nudged problem ``min_z E + βℓ`` is a minimisation, but the free problem enters with a minus sign,
``−min_z E``, i.e. as a maximisation. The paper (Section 2, after Definition 1) remarks that for ``E``
convex in ``z`` duality turns it into a "min–min–min" problem. For ``E = h + ι_C`` with ``h`` convex and
``C = {lo ≤ z ≤ hi}`` a box, Lagrangian duality on the box constraints gives (strong duality holds: the
constraints are affine)

    min_{z ∈ C} h(z) = max_{μ_lo, μ_hi ≥ 0} −h*(μ_lo − μ_hi) + μ_loᵀlo − μ_hiᵀhi,

with ``h*`` the convex conjugate of ``h`` (:meth:`~inferlearn.bilevel.layer.Energy.conjugate`) and one
multiplier per finite bound (the multipliers of infinite bounds are fixed at 0). So
``−min E = min_μ D̃(μ)`` with ``D̃(μ) = h*(μ_lo − μ_hi) − μ_loᵀlo + μ_hiᵀhi``, and for β > 0

    L^β(θ) = (1/β) min_{z ∈ C, μ ≥ 0} [ E(z;θ) + β ℓ(z) + D̃(μ;θ) ]                (min–min–min)

a single *joint* minimisation over the primal ``z`` of the nudged problem and the dual ``μ`` of the free
one (separable, so jointly convex when ``ℓ`` is convex). Its θ-gradient is Danskin's on the joint problem,
``(1/β)[∇_θE(ẑ) + ∇_θD̃(μ̂)]``, which equals the min−min form's ``(1/β)[∇_θE(ẑ) − ∇_θE(z*)]`` because
``∇_θ D̃(μ*) = −∇_θ min E`` at the dual solution (the free primal is recovered as ``z* = ∇h*(μ_lo − μ_hi)``).
:func:`dual_surrogate` solves the joint problem with the argmin layer's FISTA on the stacked variable
``(z, μ_lo, μ_hi)`` (a box: ``z ∈ C``, ``μ ≥ 0``); tests check value and gradient against
:func:`~inferlearn.bilevel.layer.contrastive_surrogate`, the min−min form.

Only β > 0: for ``−β`` the nudged problem ``min E − βℓ`` would itself need a dual (the conjugate of ℓ).

References:
    Zach, "Bilevel programs meet deep learning", Definition 1 and the "min-min-min" remark; Rockafellar,
    Convex Analysis, Fenchel duality; docs/maths.md §B.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from ..engine.phases import check_beta
from ..engine.solvers import SolveInfo
from ..units import Box
from .energies import Energy, FunctionEnergy
from .fista import AcceleratedProjectedGradient, as_box, solve
from .layer import per_sample_loss


def _bounds(box: Box, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The box's bounds as tensors of ``like``'s shape (``±inf`` where unbounded)."""
    lo, hi = box.lower, box.upper
    lo = lo.to(like).expand_as(like) if isinstance(lo, torch.Tensor) else torch.full_like(like, lo)
    hi = hi.to(like).expand_as(like) if isinstance(hi, torch.Tensor) else torch.full_like(like, hi)
    return lo, hi


def dual_objective(energy: Energy, mu_lo: torch.Tensor, mu_hi: torch.Tensor, inputs: Sequence[torch.Tensor],
                   box: Box | None = None) -> torch.Tensor:
    """``D̃(μ) = h*(μ_lo − μ_hi) − μ_loᵀlo + μ_hiᵀhi`` per sample, whose minimum over ``μ ≥ 0`` is ``−min_{z∈C} E``.

    Multipliers of infinite bounds are ignored (read as 0).
    """
    lo, hi = _bounds(as_box(box), mu_lo)
    mu_lo = torch.where(torch.isfinite(lo), mu_lo, torch.zeros_like(mu_lo))
    mu_hi = torch.where(torch.isfinite(hi), mu_hi, torch.zeros_like(mu_hi))
    lo = torch.where(torch.isfinite(lo), lo, torch.zeros_like(lo))
    hi = torch.where(torch.isfinite(hi), hi, torch.zeros_like(hi))
    return energy.conjugate(mu_lo - mu_hi, *inputs) - (mu_lo * lo).sum(-1) + (mu_hi * hi).sum(-1)


def solve_joint(energy: Energy, loss: Callable[[torch.Tensor], torch.Tensor] | None, inputs: Sequence[torch.Tensor],
                beta: float, box: Box | None = None, solver=None, init: torch.Tensor | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, SolveInfo]:
    """``argmin_{z ∈ C, μ ≥ 0} E(z) + β ℓ(z) + D̃(μ)``: returns ``(ẑ, μ_lo, μ_hi, info)`` (``loss=None``: β ℓ = 0,
    then ``ẑ`` is the free solution and ``D̃(μ) = −E(ẑ)`` at the optimum: strong duality)."""
    box = as_box(box)
    inputs = [x.detach() for x in inputs]
    z0 = init.detach() if init is not None else energy.initial(*inputs)
    box.check(z0.shape)
    n = z0.shape[-1]
    lo, hi = _bounds(box, z0)
    zero, inf = torch.zeros_like(z0), torch.full_like(z0, math.inf)
    # a multiplier per bound; those of infinite bounds do not enter D̃ (zero gradient: they stay at 0)
    joint_box = Box(torch.cat([lo, zero, zero], -1), torch.cat([hi, inf, inf], -1))

    def joint(w, *xs):
        z, mu_lo, mu_hi = w[..., :n], w[..., n:2 * n], w[..., 2 * n:]
        v = energy.value(z, *xs) + dual_objective(energy, mu_lo, mu_hi, xs, box)
        return v if loss is None else v + beta * per_sample_loss(loss, z)

    w0 = torch.cat([box.project(z0), zero, zero], -1)
    w, info = solve(FunctionEnergy(joint), inputs, joint_box, solver or AcceleratedProjectedGradient(), init=w0)
    mu_lo = torch.where(torch.isfinite(lo), w[..., n:2 * n], zero)
    mu_hi = torch.where(torch.isfinite(hi), w[..., 2 * n:], zero)
    return w[..., :n], mu_lo, mu_hi, info


def dual_surrogate(energy: Energy, loss: Callable[[torch.Tensor], torch.Tensor], *inputs: torch.Tensor, beta: float,
                   box: Box | None = None, solver=None, init=None) -> torch.Tensor:
    """``L^β`` of Definition 1 solved as the joint min–min–min problem ``(1/β) min_{z, μ} E + βℓ + D̃``.

    Returns a scalar whose value is ``L^β`` and whose gradient with respect to the inputs (and the
    energy's parameters) is Danskin's on the joint problem; both equal
    :func:`~inferlearn.bilevel.layer.contrastive_surrogate`'s (the min−min form).

    Args:
        energy: an energy with a :meth:`~inferlearn.bilevel.layer.Energy.conjugate`.
        loss: ``ℓ(z)``, a scalar (summed over the batch).
        beta: ``β > 0``.

    Raises:
        ValueError: ``β ≤ 0`` or non-finite, non-finite inputs, an energy without a conjugate.
    """
    beta = check_beta(beta)
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.is_floating_point() and not torch.isfinite(x).all():
            raise ValueError("dual_surrogate input contains NaN or inf values")
    xs = [x.detach() for x in inputs]
    try:
        energy.conjugate(init.detach() if init is not None else energy.initial(*xs), *xs)
    except NotImplementedError as e:
        raise ValueError(str(e)) from None
    z, mu_lo, mu_hi, _ = solve_joint(energy, loss, inputs, beta, box, solver, init)
    z, mu_lo, mu_hi = z.detach(), mu_lo.detach(), mu_hi.detach()
    return loss(z) + (energy.value(z, *inputs) + dual_objective(energy, mu_lo, mu_hi, inputs, box)).sum() / beta
