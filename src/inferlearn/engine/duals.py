"""Dual energies of lifted networks, strong duality, and free-energy scoring of inputs.

Lagrangian duality on ``e_k = z_k − W_{k-1} z_{k-1} − b_{k-1}`` with multipliers ``λ_k`` turns the
(free, clamped or nudged) energy of a :class:`~inferlearn.engine.problems.LiftedProblem` into::

    D(λ) = − Σ_{k=1}^{L} ‖λ_k‖² / (2 w_k) − Σ_{k=1}^{L-1} σ_{C_k}(W_kᵀ λ_{k+1} − λ_k)
           − λ_1ᵀ (W_0 x + b_0) − Σ_{k=2}^{L} λ_kᵀ b_{k-1} + [clamped] λ_Lᵀ y

with ``σ_C(s) = sup_{z∈C} sᵀz = φ*(s)`` the support function (the conjugate of ``ι_C``); a free
output forces ``λ_L = −β g`` (``0`` without nudge). Per coordinate: linear ``σ = ι_{0}`` (so
``λ_k = W_kᵀλ_{k+1}``), ReLU ``σ = ι_{≤0}`` (``λ_k ≥ W_kᵀλ_{k+1}``), hard sigmoid ``σ(s) = ‖[s]_+‖_1``,
hard tanh ``σ(s) = ‖s‖_1``. The optimal multipliers are ``λ_k = w_k (z_k − a_k)``; with the paper's
normalisation ``μ_k = λ_k / w_k = z_k − a_k`` the constraints read ``μ_k = γ W_kᵀ μ_{k+1}`` (linear)
and ``μ_k ≥ γ W_kᵀ μ_{k+1}`` (ReLU), and the hard-sigmoid penalty is ``‖[γ W_kᵀ μ_{k+1} − μ_k]_+‖_1``
(docs/maths.md §A). Strong duality holds (convex QP with a Slater point), so ``min E = max D``.

Reading ``min_z`` as a zero-temperature log-sum-exp, ``min_z E(z; x)`` is an unnormalised ``−log p(x)``
and ``min Ê − min E`` a ``−log p(y | x)``: :func:`free_energy` and :func:`class_energies` compute them.

References:
    Zach & Estellers, "Contrastive learning for lifted networks" (BMVC 2019), Eqs. 10-16, 19-21, 24.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..units import Box
from .problems import LiftedEnergy, LiftedProblem
from ..losses import one_hot
from .solvers import Solver, get_solver


def support(units: Box, s: torch.Tensor, tol: float = 1e-9) -> torch.Tensor:
    """Per-sample ``σ_C(s) = sup_{z ∈ C} sᵀz`` for a box; ``+inf`` where ``s`` points into an unbounded side.

    Args:
        tol: components within ``tol`` of the feasible side count as feasible (rounding of an optimal λ).
    """
    pos, neg = s.clamp(min=0), (-s).clamp(min=0)
    out = torch.zeros(s.shape[0], dtype=s.dtype, device=s.device)
    if math.isinf(units.upper):
        out = torch.where((s > tol).any(dim=1), torch.full_like(out, math.inf), out)
    else:
        out = out + units.upper * pos.sum(dim=1)
    if math.isinf(units.lower):
        out = torch.where((s < -tol).any(dim=1), torch.full_like(out, math.inf), out)
    else:
        out = out - units.lower * neg.sum(dim=1)
    return out


def multipliers(problem: LiftedProblem, hidden: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The multipliers ``λ_k = w_k (z_k − a_k)``, ``k = 1 … L``, at given activations (optimal at the minimiser)."""
    e = problem.energy
    zs = problem.full(hidden)
    return [e.term_weights[k] * (zs[k] - e.pre(k, zs[k - 1])) for k in range(1, e.depth + 1)]


def dual_value(problem: LiftedProblem, lams: Sequence[torch.Tensor], tol: float = 1e-9) -> torch.Tensor:
    """Per-sample dual objective ``D(λ)`` (``−inf`` where ``λ`` is infeasible), a lower bound of ``min E``.

    Args:
        lams: ``[λ_1, …, λ_L]``, each ``(batch, n_k)``. For free rows ``λ_L`` must equal ``−βg``
            (it is replaced by that value: it is not a free dual variable there).
        tol: feasibility tolerance of the support functions (see :func:`support`).
    """
    e = problem.energy
    L = e.depth
    if len(lams) != L:
        raise ValueError(f"Expected {L} multipliers λ_1..λ_L, got {len(lams)}")
    lams = list(lams)
    free_top = torch.zeros_like(lams[-1]) if problem.free_shift is None else problem.free_shift * e.term_weights[L]
    if problem.n_clamped < problem.batch:
        lams[-1] = torch.where(problem.clamped.unsqueeze(1), lams[-1], free_top)
    val = -sum((lam.pow(2).sum(dim=1) / (2 * e.term_weights[k])) for k, lam in enumerate(lams, start=1))
    for k in range(1, L):
        s = lams[k] @ e.weights[k] - lams[k - 1]
        val = val - support(e.units[k - 1], s, tol)
    val = val - (lams[0] * problem.a1).sum(dim=1)
    for k in range(2, L + 1):
        val = val - lams[k - 1] @ e.biases[k - 1]
    if problem.n_clamped:
        val = val + torch.where(problem.clamped, (lams[-1] * problem.target).sum(dim=1), torch.zeros_like(val))
    return val


def duality_gap(problem: LiftedProblem, hidden: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-sample ``E(z) − D(λ(z))`` with ``λ(z)`` from :func:`multipliers` (0 at the minimiser)."""
    return problem.value(hidden) - dual_value(problem, multipliers(problem, hidden))


def free_energy(model, x: torch.Tensor, gamma: float = 1 / 8, solver: str | Solver = "reference") -> torch.Tensor:
    """Per-sample ``min_z E(z; x)``: an unnormalised negative log-likelihood of the inputs.

    Note:
        The paper reports that this is of limited use for scoring inputs: with weak feedback only the
        first hidden layer contributes noticeably.
    """
    energy = LiftedEnergy.from_model(model, gamma)
    problem = energy.problem(x.to(energy.dtype))
    hidden, _ = get_solver(solver).solve(problem)
    return problem.value(hidden)


def class_energies(model, x: torch.Tensor, gamma: float = 1 / 8, solver: str | Solver = "reference") -> torch.Tensor:
    """``(batch, n_classes)`` contrastive energies ``min Ê(z; x, e_c) − min E(z; x)`` for every class.

    A zero-temperature ``−log p(c | x)`` up to a constant: the smallest entry is the lifted
    network's prediction (close to the forward pass's arg-max for weak feedback).
    """
    energy = LiftedEnergy.from_model(model, gamma)
    x = x.to(energy.dtype)
    solver = get_solver(solver)
    B, C = x.shape[0], energy.sizes[-1]
    free = energy.problem(x)
    f_val = free.value(solver.solve(free)[0])
    xs = x.repeat_interleave(C, dim=0)
    ys = one_hot(torch.arange(C, device=x.device).repeat(B), C, energy.dtype)
    clamped = energy.problem(xs, ys)
    c_val = clamped.value(solver.solve(clamped)[0]).reshape(B, C)
    return c_val - f_val.unsqueeze(1)
