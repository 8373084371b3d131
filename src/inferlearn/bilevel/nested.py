"""Deeply nested problems: the non-linearised top-down surrogate and the bottom-up surrogate ``L_GC``.

A layered network is the nested problem (Section 3 of the bilevel paper; docs/maths.md §B)

    min_θ ℓ(z_L*),   z_k* = argmin_{z_k} E_k(z_k, z_{k-1}*; θ),   k = 1 … L,   z_0 = x,

here with the proximal layer energy ``E_k = ½‖z_k − a_k‖² + ι_{C_k}(z_k)``, ``a_k = A_k(z_{k-1})`` (its argmin
is the forward pass ``z_k = Π_{C_k}(a_k)``; ``C_L = ℝ``) and the quadratic loss ``ℓ(z_L) = ½‖z_L − y‖²``.
Write ``m_k(z_{k-1}) = min_{z_k} E_k = ½ dist(a_k, C_k)²`` and ``gap_k = E_k − m_k ≥ 0`` (zero exactly at the
forward pass: the Fenchel–Young gap, the engine's ``fenchel`` layer term). The contrastive surrogate
(Definition 1) can be applied level by level in two directions:

**Top-down (outside-in), not linearised.** Replace the outermost level first; the surrogate's value is the
next level's loss: ``ℓ_L = ℓ`` and

    ℓ_{k-1}(z_{k-1}) = (1/β_k) [ min_{z_k} (E_k(z_k, z_{k-1}) + β_k ℓ_k(z_k)) − m_k(z_{k-1}) ],   L_TD = ℓ_0(x).

Since ``m_k`` does not depend on ``z_k`` it moves inside the ``min``, ``ℓ_{k-1}(z_{k-1}) = min_{z_k}
gap_k/β_k + ℓ_k(z_k)``, and the nested minimisations merge into **one joint minimisation**

    L_TD(θ) = min_{z_1 … z_L} ℓ(z_L) + Σ_k (1/β_k) gap_k(z_k, z_{k-1}),

the lifted Fenchel / LPOM energy with term weights ``1/β_k`` and a free output carrying the loss. Eliminating
the output, ``min_{z_L} ½‖z_L − y‖² + ½‖z_L − a_L‖²/β_L = ½‖a_L − y‖²/(1 + β_L)``, gives the engine's
``fenchel`` :class:`~inferlearn.engine.problems.LayeredEnergy` with weights ``[1/β_1, …, 1/β_{L−1}, 1/(1+β_L)]``
and the output clamped to ``y`` — solved by the engine's block solver (:func:`topdown_surrogate`).
Linearising ``ℓ_k`` at the forward pass instead gives the closed-form recursion of Fenchel back-propagation
(:class:`~inferlearn.rules.fenchel.FenchelBackProp`). ``L_TD ≤ ℓ(z_L*)`` (the forward pass is feasible with
zero gaps), and as all ``β_k → 0`` it is a penalty method for the constraints ``gap_k = 0``: value and
gradient approach ``ℓ(z_L*)`` and back-propagation with error O(β) (tested: the error halves with β).

**Bottom-up (inside-out), L_GC.** Replacing the innermost level first puts the subtracted free problem
``−min E`` of each level *inside* the minimisation over the earlier levels (a min–max problem; the paper
calls the bottom-up reformulations "non-promising"). Evaluating the free part as one global problem gives
the two-phase, global contrastive form of CHL / EqProp on the lifted energy

    L_GC(θ) = min_z [ ℓ(z_L) + Σ_k (1/β_k) E_k(z_k, z_{k-1}) ] − min_z Σ_k (1/β_k) E_k(z_k, z_{k-1})

(engine's ``lifted`` energies: the first term clamped like ``L_TD``'s, the second free; :func:`bottomup_surrogate`).
It coincides with ``L_TD`` when the global free minimiser is the forward pass (linear units: tested), but with
constrained units the global free problem differs from the forward pass unless the layers are weighted
increasingly: ``β_1 ≪ β_2 ≪ … ≪ β_L`` (term-weight ratios ``β_k/β_{k+1} = γ → 0``, the lifted paper's
feedback weight). With equal ``β_k → 0`` ``L_GC`` does not approach back-propagation (tested: the error
stays O(1)); with ``β_k = β γ^{L−k}`` (:func:`layer_betas`) and ``β, γ → 0`` it does, at order O(β + γ).
(reconstructed: the paper's appendix on ``L_GC`` is not in our copy of the text.)

Both functions return a :class:`NestedSurrogate` whose ``value`` is a scalar (the batch mean) that is
differentiable in the model's parameters: the terms are re-evaluated at the fixed minimisers, so
``value.backward()`` is the envelope (Danskin) gradient. Any chain of affine maps with box units and a
linear output (the lifted energies' chains), float64 recommended for small β.

References:
    Zach, "Bilevel programs meet deep learning", Definition 1, Section 3 (top-down and bottom-up traversal,
    Eq. 37), Table 1; Gu et al. (2020); Li et al. (2019); docs/maths.md §B.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from ..engine.graph import AFFINE, read_graph
from ..engine.problems import LayeredEnergy, LayeredProblem
from ..engine.solvers import BlockProjectedGradient, Solver, SolveInfo


@dataclass
class NestedSurrogate:
    """A nested surrogate evaluated on a batch.

    Attributes:
        value: the batch mean of the per-row surrogate, differentiable in the model's parameters (Danskin).
        rows: the per-row values (detached).
        hidden: the hidden layers at the (first, loss-carrying) minimiser.
        solves: the :class:`~inferlearn.engine.solvers.SolveInfo` of each inference.
    """

    value: torch.Tensor
    rows: torch.Tensor
    hidden: list
    solves: list = field(default_factory=list)


def layer_betas(beta: float, depth: int, gamma: float = 1.0) -> list[float]:
    """``[β γ^{L−1}, …, β γ, β]``: ``β_L = β`` at the output and ``β_k/β_{k+1} = γ`` below (``γ = 1``: equal)."""
    if not (isinstance(gamma, (int, float)) and math.isfinite(gamma) and gamma > 0):
        raise ValueError(f"Invalid gamma: {gamma}")
    (beta,) = _betas(beta, 1)
    return [beta * gamma ** (depth - k) for k in range(1, depth + 1)]


def _betas(beta, depth: int) -> list[float]:
    if isinstance(beta, (int, float)) and not isinstance(beta, bool):
        beta = [beta] * depth
    beta = list(beta)
    if len(beta) != depth:
        raise ValueError(f"Need one beta per layer ({depth}), got {len(beta)}")
    for b in beta:
        if not (isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b) and b > 0):
            raise ValueError(f"Invalid beta: {b}")
    return [float(b) for b in beta]


def _default_solver() -> Solver:
    return BlockProjectedGradient(max_iter=20000, tol=1e-11, check_every=5, on_fail="warn", residual="exact",
                                  safe_steps=True)


def _setup(model: nn.Module, x: torch.Tensor, target: torch.Tensor, name: str):
    if not isinstance(x, torch.Tensor) or not isinstance(target, torch.Tensor):
        raise TypeError(f"{name}: x and target must be tensors")
    if not (torch.isfinite(x).all() and torch.isfinite(target).all()):
        raise ValueError(f"{name}: x or target contains NaN or inf values")
    if x.shape[0] == 0 or target.shape[0] != x.shape[0]:
        raise ValueError(f"{name}: x and target need the same non-zero number of rows, got {x.shape[0]} and "
                         f"{target.shape[0]}")
    chain = read_graph(model, AFFINE, name)
    with torch.no_grad():
        out = model(x)
    if out.shape != target.shape:
        raise ValueError(f"{name}: target of shape {tuple(target.shape)} does not match the output {tuple(out.shape)}")
    return chain


def _solve(problem: LayeredProblem, solver: Solver) -> tuple[list[torch.Tensor], SolveInfo]:
    hidden, info = solver.solve(problem)
    return [h.detach() for h in hidden], info


def topdown_surrogate(model: nn.Module, x: torch.Tensor, target: torch.Tensor, beta: float | Sequence[float],
                      solver: Solver | None = None) -> NestedSurrogate:
    """The non-linearised top-down surrogate ``L_TD = min_z ½‖z_L − y‖² + Σ_k gap_k/β_k`` (one joint problem).

    Args:
        model: a chain of affine maps with box units and a linear output.
        x: inputs (rows = samples).
        target: ``y``, the output's target.
        beta: ``β > 0`` for every level, or one ``β_k`` per layer (``k = 1 … L``).
        solver: an engine solver for the Fenchel-gap problem (default: safe block projected-gradient sweeps to
            a residual of ``1e-11``).
    """
    chain = _setup(model, x, target, "topdown_surrogate")
    betas = _betas(beta, chain.depth)
    energy = LayeredEnergy(chain, "fenchel", [1 / b for b in betas[:-1]] + [1 / (1 + betas[-1])])
    problem = LayeredProblem(energy, x, target=target)
    hidden, info = _solve(problem, solver or _default_solver())
    rows = problem.value(hidden, fresh_a1=True)
    return NestedSurrogate(rows.mean(), rows.detach(), hidden, [info])


def bottomup_surrogate(model: nn.Module, x: torch.Tensor, target: torch.Tensor, beta: float | Sequence[float],
                       solver: Solver | None = None) -> NestedSurrogate:
    """The bottom-up (global contrastive) surrogate ``L_GC = min_z [ℓ + Σ E_k/β_k] − min_z Σ E_k/β_k``.

    The arguments are those of :func:`topdown_surrogate`, with the solver working on the lifted problems.
    ``L_GC`` approaches back-propagation only for ``β_1 ≪ … ≪ β_L`` (:func:`layer_betas` with ``γ → 0``).
    """
    chain = _setup(model, x, target, "bottomup_surrogate")
    betas = _betas(beta, chain.depth)
    solver = solver or _default_solver()
    weights = [1 / b for b in betas[:-1]]
    loaded = LayeredProblem(LayeredEnergy(chain, "lifted", weights + [1 / (1 + betas[-1])]), x, target=target)
    free = LayeredProblem(LayeredEnergy(chain, "lifted", weights + [1 / betas[-1]]), x)
    h_loaded, info_l = _solve(loaded, solver)
    h_free, info_f = _solve(free, solver)
    rows = loaded.value(h_loaded, fresh_a1=True) - free.value(h_free, fresh_a1=True)
    return NestedSurrogate(rows.mean(), rows.detach(), h_loaded, [info_l, info_f])
