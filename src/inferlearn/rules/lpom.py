"""Lifted proximal operator machines (LPOM): layer-wise fixed-point updates of the activations, and the weights.

LPOM (Li et al. 2019) writes an activation ``φ`` that is a proximal operator, ``φ = prox_f``, through two
integrals of it, ``f(x) = ∫_0^x (φ^{-1}(s) − s) ds`` and ``g(a) = ∫_0^a (φ(s) − s) ds``, and penalises each
layer by (docs/maths.md §B, taxonomy row "LPOM, lifted Fenchel nets")::

    h(z, a) = f(z) + g(a) + ½‖z − a‖²  ≥ 0,   = 0 exactly when z = φ(a)

(``F = f + ½‖·‖²`` and ``G = g + ½‖·‖²`` are convex conjugates, so ``h = F(z) + G(a) − zᵀa`` is a
Fenchel–Young gap). For the box units of this library ``φ = Π_C`` (ReLU, hard sigmoid, hard tanh,
ReLU6, linear), ``f = ι_C`` and ``g(a) = ∫_0^a (Π_C(s) − s) ds = −½ dist(a, C)²`` (for ``0 ∈ C``;
:func:`integral_potential`), which is the engine's ``fenchel`` term
(:class:`~inferlearn.engine.problems.LayeredEnergy`). Per sample, with a linear output layer and the
quadratic loss, LPOM minimises over the activations ``z_1 … z_L`` and the weights::

    J(W, z) = ½‖z_L − y‖² + μ Σ_{k=1}^{L} h_k(z_k, a_k),   a_k = A_k(z_{k−1}) = W_{k−1} z_{k−1} + b_{k−1},  z_0 = x

with ``h_L = ½‖z_L − a_L‖²`` (``φ_L`` the identity). It is convex in each ``z_k`` with the others fixed,
and LPOM updates the activations **block by block** (here top-down, from the forward pass):

* output, in closed form: ``z_L = (μ a_L + y) / (μ + 1)``;
* hidden layer ``k``, LPOM's fixed-point iteration for ``0 ∈ ∂_{z_k} J``
  (``φ^{-1}(z_k) − a_k + A_{k+1}ᵀ(φ(a_{k+1}) − z_{k+1}) ∋ 0``)::

      z_k ← φ( a_k − A_{k+1}ᵀ (φ(A_{k+1} z_k + b_k) − z_{k+1}) )

  a contraction when ``‖A_{k+1}‖² < 1`` (``φ`` is 1-Lipschitz). Beyond that the update is damped to
  ``z_k ← Π_C( (1−t) z_k + t (a_k − A_{k+1}ᵀ(φ(a_{k+1}) − z_{k+1})) )`` with ``t = 1/‖A_{k+1}‖²``, the
  projected-gradient step on the same subproblem, which converges for every ``W``
  (:meth:`~inferlearn.engine.problems.LayeredProblem.block_step`, ``t = 1`` is LPOM's update).

The weights minimise ``J`` at the fixed activations, layer by layer; the rule gives the gradient
(``∇g = φ − id``, so the ``g`` term turns the regression residual into ``φ(a_k) − z_k``)::

    ∇_{W_{k−1}} J / B = (μ / B) Σ_n (φ_k(a_{k,n}) − z_{k,n}) z_{k−1,n}ᵀ,   ∇_{b_{k−1}} likewise

and the optimiser steps (LPOM's own W-update is this gradient step). Any chain of affine maps with
box units (conv nets included, through the generic engine's adjoints).

References:
    Li, Fang, Chen & Lin, "Lifted proximal operator machines" (AAAI 2019), Eqs. 4–6 (the penalty
    from the integrals of φ), the fixed-point update of the activations and the weight update; Zach,
    "Bilevel programs meet deep learning", Table 1 (LPOM row); Gu et al. (2020), Fenchel lifted
    networks (:class:`~inferlearn.rules.lifted_fenchel.LiftedFenchel` solves the same gap energy with a
    clamped output and block gradient sweeps).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..engine.graph import AFFINE, Graph, read_graph
from ..engine.problems import LayeredEnergy, LayeredProblem, operator_norm_sq
from ..engine.solvers import EQUILIBRIUM_SWEEPS, SolveInfo, finish, fixed_steps_verdict, residual_floor, warn_far
from ..losses import one_hot, quadratic_loss
from ..units import Box
from .base import Rule, StepInfo, check_positive, register_rule


MU_LIMIT = 1e8

#: a run without ``tol`` is *far* from its fixed point when the last sweep still moves an activation by more
#: than this fraction of the first sweep's largest move. On MNIST MLPs (784-64-64-10, 784-64-64-64-10, μ = 1
#: and 10) the weight gradient's error against 2000 sweeps is 1-1.5× this ratio: 0.05-0.10 and 1-11 % at the
#: default 10 sweeps, 0.2-0.6 and 14-57 % at 2-5 sweeps (``benchmarks/investigations/convergence_checks.py``)
FAR_RTOL = 0.2


def integral_potential(units: Box | None, a: torch.Tensor) -> torch.Tensor:
    """``g(a) = ∫_0^a (φ(s) − s) ds`` element-wise for ``φ = Π_C``: ``−½ dist(a, C)²`` (exact for ``0 ∈ C``;
    otherwise up to a constant). ``None`` (a linear unit) gives 0."""
    if units is None or units.is_linear:
        return torch.zeros_like(a)
    return -0.5 * (units.project(a) - a).pow(2)


def lpom_penalty(units: Box | None, z: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Per-row ``h(z, a) = f(z) + g(a) + ½‖z − a‖²`` for a feasible ``z ∈ C`` (``f = ι_C`` is 0 there)."""
    return (integral_potential(units, a) + 0.5 * (z - a).pow(2)).flatten(1).sum(1)


@register_rule
@dataclass
class LPOM(Rule):
    """LPOM: ``½‖z_L − y‖² + μ Σ_k [f(z_k) + g(a_k) + ½‖z_k − a_k‖²]``, block fixed-point updates of ``z``.

    Args:
        mu: the penalty weight ``μ > 0`` of every layer.
        sweeps: top-down sweeps over the layers (output first), from the forward pass; 0 keeps it.
        inner: fixed-point iterations per hidden layer and sweep.
        tol: stop early when a sweep moves no activation by more than ``tol`` (warns if ``sweeps`` run
            out first); ``None``: exactly ``sweeps`` sweeps.

    ``StepInfo.extras``: ``inference_steps`` (sweeps done), ``solver_residual`` (the largest move of the
    last sweep), ``converged`` and ``far`` (the verdict below), ``hidden`` and ``output`` (the inferred
    ``z_1 … z_{L−1}`` and ``z_L``).

    Convergence: every batch compares the last sweep's largest move with the first one's (no extra work).
    Without ``tol`` the sweeps count as converged when the ratio is below 1e-3
    (:data:`~inferlearn.engine.solvers.CONVERGED_RTOL`), which LPOM's default 10 sweeps do not reach (0.05-0.10
    on MNIST MLPs, a weight gradient 1-11 % from the fixed point's); above :data:`FAR_RTOL` (0.2) one
    :class:`~inferlearn.errors.ConvergenceWarning` per run says inference is far from its fixed point.
    How far the gradient is from the equilibrium's is not in ``StepInfo`` (it needs the equilibrium): measure
    it with :func:`inferlearn.diagnostics.equilibrium_gap`, or ``inferlearn train --check-equilibrium`` (after
    every epoch, one warning per run above 10 %).

    References:
        Li et al. (2019), LPOM; Zach, bilevel paper, Table 1.
    """

    name = "lpom"
    mu: float = 1.0
    sweeps: int = 10
    inner: int = 3
    tol: float | None = None

    def __post_init__(self) -> None:
        check_positive("mu", self.mu)
        if self.mu > MU_LIMIT:
            raise ValueError(f"Invalid mu: {self.mu} (at most {MU_LIMIT:g}; beyond, μ(φ(a) − z) is all rounding error)")
        for key in ("sweeps", "inner"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < (0 if key == "sweeps" else 1):
                raise ValueError(f"Invalid {key}: {v}")
        if self.tol is not None:
            check_positive("tol", self.tol)

    def equilibrium_options(self) -> dict:
        """:data:`~inferlearn.engine.solvers.EQUILIBRIUM_SWEEPS` block sweeps, no early stop."""
        return {"sweeps": max(self.sweeps, EQUILIBRIUM_SWEEPS), "tol": None}

    def energy(self, chain: Graph) -> LayeredEnergy:
        """``μ Σ_k h_k``: the engine's Fenchel–Young-gap terms (``h_k`` for box units), every weight ``μ``."""
        return LayeredEnergy(chain, "fenchel", [self.mu] * chain.depth)

    def output_update(self, a_top: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``argmin_z ½‖z − y‖² + (μ/2)‖z − a_L‖² = (μ a_L + y) / (μ + 1)``."""
        return (self.mu * a_top + y) / (self.mu + 1.0)

    def layer_steps(self, problem: LayeredProblem, hidden: list[torch.Tensor]) -> list[float]:
        """``t_k = min(1, 1/‖A_{k+1}‖²)`` per hidden layer (1: LPOM's fixed-point update); on a graph
        ``1/Σ_c (Σ_{e: k→c} ‖A_e‖)²`` over the node's children."""
        e, out = problem.energy, []
        for k in range(1, problem.depth):
            z = hidden[k - 1]
            norms: dict[int, float] = {}
            for c, edge in e.out_edges(k):
                norms[c] = norms.get(c, 0.0) + operator_norm_sq(edge, z.shape[1:], z.dtype, z.device) ** 0.5
            out.append(min(1.0, 1.0 / max(sum(v * v for v in norms.values()), 1e-30)))
        return out

    @torch.no_grad()
    def block_update(self, problem: LayeredProblem, hidden: list[torch.Tensor], k: int, iterations: int,
                     t: float, adjoint=None) -> float:
        """``iterations`` fixed-point updates of hidden layer ``k`` (``z_{k±1}`` and the output
        ``problem.target`` fixed), in place in ``hidden``; returns the largest move."""
        e, L = problem.energy, problem.depth
        zs = [problem.x, *hidden]
        pre = [None] * (L + 1)
        pre[k] = problem.a1 if k == 1 else e.pre(k, zs)
        adjoint = problem.adjoints(hidden)[k] if adjoint is None else adjoint
        units = e.node(k).units
        move = 0.0
        for _ in range(iterations):
            for c, _ in adjoint:
                pre[c] = e.pre(c, zs)
            new = problem.block_step(k, hidden, pre, adjoint, t, units)
            move = max(move, float((new - hidden[k - 1]).abs().max()))
            hidden[k - 1] = zs[k] = new
        return move

    @torch.no_grad()
    def infer(self, problem: LayeredProblem, y: torch.Tensor) -> tuple[list[torch.Tensor], int, float]:
        """LPOM's activations for ``problem`` (built with ``target`` = any tensor of the output's shape;
        on return ``problem.target`` holds ``z_L``). Returns ``(hidden, sweeps done, last move, first move)``."""
        e, L = problem.energy, problem.depth
        hidden = [h.clone() for h in problem.forward_state()[0]]
        top = lambda: e.pre(L, [problem.x, *hidden])   # noqa: E731
        problem.target = self.output_update(top(), y)
        it, move, first = 0, 0.0, None
        if L > 1 and self.sweeps:
            adjoints = problem.adjoints(hidden)
            steps = self.layer_steps(problem, hidden)
            for it in range(1, self.sweeps + 1):
                move = 0.0
                for k in range(L - 1, 0, -1):
                    move = max(move, self.block_update(problem, hidden, k, self.inner, steps[k - 1], adjoints[k]))
                problem.target = self.output_update(top(), y)
                first = move if it == 1 else first
                if self.tol is not None and move <= self.tol:
                    break
        return hidden, it, move, first

    def verdict(self, hidden: list[torch.Tensor], iterations: int, move: float, first: float | None) -> SolveInfo:
        """The sweeps' :class:`~inferlearn.engine.solvers.SolveInfo`: against ``tol`` (warned when missed), or
        relative to the first sweep's move (warned once per run when above :data:`FAR_RTOL`)."""
        if self.tol is not None:
            return finish(self.name, None, hidden, iterations, self.tol, "warn", residual=move, owner=self)
        info = fixed_steps_verdict(self.name, move, iterations, first, residual_floor(hidden))
        if first and not info.converged and move > FAR_RTOL * first:
            warn_far(self, info, f"{self.name}: inference far from its fixed point after {iterations} sweeps: the last "
                     f"sweep still moved an activation by {move:.3g}, {move / first:.2g} of the first sweep's "
                     f"{first:.3g} (> {FAR_RTOL:g}); raise sweeps (now {self.sweeps})")
        return info

    def _backward(self, model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> StepInfo:
        chain = read_graph(model, AFFINE, self.name, example=x)
        B, L = x.shape[0], chain.depth
        free = LayeredProblem(self.energy(chain), x)
        output = free.forward_state()[1][L]
        y = one_hot(labels, output.shape[1], x.dtype)
        problem = free.stacked(1, target=y)           # all rows clamped: the output z_L is problem.target
        hidden, it, move, first = self.infer(problem, y)
        info = self.verdict(hidden, it, move, first) if it else SolveInfo(self.name, 0, 0.0, True, None)
        problem.accumulate_weight_grads(hidden, 1.0 / B, precise=False)   # ∇_θ μ Σ_k h_k at the fixed z (the loss has no θ)
        return StepInfo(loss=float(quadratic_loss(output, y)), output=output.detach(),
                        extras={"inference_steps": it, "solver_residual": move, "converged": info.converged,
                                "far": info.far,
                                "hidden": [h.detach() for h in hidden], "output": problem.target.detach()})
